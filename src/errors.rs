//! Errors as people read them: an error and its causes in one line, "what failed: why: why deeper",
//! each cause said once. Many errors already say their cause (`#[error("cannot open {path}: {source}")]`
//! keeps the I/O error as its source too), so printing every link of the chain, as anyhow's `{:#}`
//! does, repeats it ("… (os error 2): … (os error 2)"). Every place that shows an error chain to a
//! user (the command line, API errors, events, worker failures) renders it with [`chain`] or
//! [`chain_of`].

use std::error::Error;

/// `error`, its contexts and their causes, each cause that the text so far does not already say.
pub fn chain(error: &anyhow::Error) -> String {
    join(error.chain())
}

/// `error` and its sources, each source that the text so far does not already say.
pub fn chain_of(error: &(dyn Error + 'static)) -> String {
    join(std::iter::successors(Some(error), |&e| e.source()))
}

fn join<'a>(links: impl Iterator<Item = &'a (dyn Error + 'static)>) -> String {
    let mut text = String::new();
    for link in links {
        let message = link.to_string();
        let message = message.trim();
        if message.is_empty() || text.contains(message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(message);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;
    use std::io;

    /// An error that says its source in its message and keeps it as its source, as thiserror's
    /// `#[error("…: {source}")]` does.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot open the model file {path}: {source}")]
    struct Open {
        path: String,
        source: io::Error,
    }

    fn missing() -> io::Error {
        std::fs::File::open("/nonexistent/shoal-errors-test.gguf").unwrap_err()
    }

    #[test]
    fn a_cause_the_message_already_says_is_not_said_again() {
        let io = missing();
        let said = io.to_string();
        assert!(said.contains("os error 2"), "{said}");
        let error = anyhow::Error::new(Open { path: "/m.gguf".into(), source: io });
        assert_eq!(format!("{error:#}"), format!("cannot open the model file /m.gguf: {said}: {said}"));
        assert_eq!(chain(&error), format!("cannot open the model file /m.gguf: {said}"));
        assert_eq!(chain(&error).matches("os error 2").count(), 1);
    }

    #[test]
    fn contexts_and_causes_that_say_something_new_are_all_kept() {
        let io = missing();
        let said = io.to_string();
        let error = Err::<(), _>(io).context("reading the model").context("starting stage 1").unwrap_err();
        assert_eq!(chain(&error), format!("starting stage 1: reading the model: {said}"));

        let nested = anyhow::Error::new(Open { path: "/m.gguf".into(), source: missing() }).context("launching m");
        assert_eq!(chain(&nested), format!("launching m: cannot open the model file /m.gguf: {said}"));
    }

    #[test]
    fn a_std_error_chain_reads_the_same() {
        let open = Open { path: "/m.gguf".into(), source: missing() };
        assert_eq!(chain_of(&open), open.to_string());
        let io = io::Error::other(Open { path: "/m.gguf".into(), source: missing() });
        assert_eq!(chain_of(&io), open.to_string(), "a wrapper that says its source once says it once");
    }
}
