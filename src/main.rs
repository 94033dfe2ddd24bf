//! The `shoal` command line. Each subcommand lives in `cli/`, one file per command.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
