//! The RDMA setup wizard: its steps across a simulated restart (the state file, a new boot time), the
//! verification's verdict on replayed Mac outputs, the exact commands of the fixes it makes itself, and
//! its API on a running node.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::{json, Value};
use shoal::node::DataDir;
use shoal::rdma::fixes::{FixId, FixOutcome, RecordingRunner};
use shoal::rdma::wizard::{self, Action, Step, VerifyResult, Wizard, WizardError};
use shoal::rdma::{self, Captures, NodeReport};
use std::path::PathBuf;
use std::time::Duration;

fn replayed(name: &str) -> NodeReport {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rdma").join(name);
    rdma::doctor(&Captures::replay(&dir).unwrap())
}

fn data_dir() -> (tempfile::TempDir, DataDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = DataDir::new(Some(tmp.path())).unwrap();
    (tmp, dir)
}

fn saved(dir: &DataDir) -> Value {
    serde_json::from_slice(&std::fs::read(dir.file(wizard::STATE_FILE)).unwrap()).unwrap()
}

#[test]
fn the_wizard_resumes_at_verification_after_the_restart() {
    let (_tmp, dir) = data_dir();
    let disabled = replayed("rdma-disabled");
    let runner = RecordingRunner::default();
    let before_restart = Some(1_800_000_000);

    let mut w = Wizard::load(&dir, before_restart);
    assert!(!w.state().started);
    assert_eq!(w.act(&Action::Next, &disabled, &runner, before_restart), Err(WizardError::NotStarted));
    w.act(&Action::Start, &disabled, &runner, before_restart).unwrap();
    let mut seen = vec![w.state().step];
    for _ in 0..4 {
        w.act(&Action::Next, &disabled, &runner, before_restart).unwrap();
        seen.push(w.state().step);
    }
    assert_eq!(
        seen,
        [Step::Why, Step::Prerequisites, Step::WhatHappens, Step::Recovery, Step::WaitingForReboot],
        "with RDMA disabled every step is shown"
    );
    let state = saved(&dir);
    assert_eq!(state["step"], "waiting_for_reboot");
    assert_eq!(state["boot_time_at_wait"], 1_800_000_000u64);

    // The node restarts without a reboot of the machine (same boot time, give or take a second): still waiting.
    assert_eq!(Wizard::load(&dir, Some(1_800_000_001)).state().step, Step::WaitingForReboot);

    // The machine restarted: a later boot time.
    let after_restart = Some(1_800_000_600);
    let w = Wizard::load(&dir, after_restart);
    assert_eq!(w.state().step, Step::Verify);
    assert!(w.state().rebooted);
    assert_eq!(saved(&dir)["step"], "verify", "the resumption is saved");

    let healthy = w.view(&replayed("healthy-two-macs")).verification.unwrap();
    assert_eq!(healthy.result, VerifyResult::EnabledAndHealthy, "{}", healthy.message);
    assert!(healthy.message.contains("en4") && healthy.failures.is_empty());

    let still = w.view(&disabled).verification.unwrap();
    assert_eq!(still.result, VerifyResult::StillDisabled);
    assert!(still.message.contains("Recovery"));

    let bridge = w.view(&replayed("bridge-active"));
    let verdict = bridge.verification.unwrap();
    assert_eq!(verdict.result, VerifyResult::OtherFailures);
    let failing: Vec<&str> = verdict.failures.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(failing, ["thunderbolt_bridge"]);
    assert_eq!(bridge.fixes.iter().map(|f| f.id).collect::<Vec<_>>(), [FixId::ThunderboltBridge]);

    let tb4 = w.view(&replayed("thunderbolt4")).verification.unwrap();
    assert_eq!(tb4.result, VerifyResult::OtherFailures);
    assert!(tb4.failures.iter().any(|c| c.id == "thunderbolt5"));

    let linux = w.view(&rdma::doctor(&Captures { platform: "linux".into(), ..Default::default() }));
    assert_eq!(linux.verification.unwrap().result, VerifyResult::NotAMac);
    assert!(runner.calls.lock().unwrap().is_empty(), "walking the steps runs nothing");
}

#[test]
fn steps_go_back_and_forth_and_reset_forgets_everything() {
    let (_tmp, dir) = data_dir();
    let runner = RecordingRunner::default();
    let healthy = replayed("healthy-two-macs");
    let mut w = Wizard::load(&dir, Some(100));
    w.act(&Action::Start, &healthy, &runner, Some(100)).unwrap();
    w.act(&Action::Back, &healthy, &runner, Some(100)).unwrap();
    assert_eq!(w.state().step, Step::Why, "back from the first step stays there");
    w.act(&Action::Next, &healthy, &runner, Some(100)).unwrap();
    w.act(&Action::Next, &healthy, &runner, Some(100)).unwrap();
    assert_eq!(w.state().step, Step::Verify, "RDMA already enabled: no Recovery steps");
    w.act(&Action::Back, &healthy, &runner, Some(100)).unwrap();
    assert_eq!(w.state().step, Step::Recovery, "back from verification redoes the Recovery steps");
    let view = w.view(&healthy);
    // As the dashboard reads them: the JSON the API sends.
    let statuses: Vec<serde_json::Value> = view.steps.iter().map(|s| serde_json::to_value(s.status).unwrap()).collect();
    assert_eq!(statuses, ["done", "done", "done", "current", "upcoming", "upcoming"]);
    let recovery = &view.steps[3];
    assert_eq!(recovery.commands, ["rdma_ctl enable"]);
    assert!(recovery.body.iter().any(|l| l.contains("Loading startup options")));
    assert!(recovery.body.iter().any(|l| l.contains("Utilities › Terminal")));

    w.act(&Action::Reset, &healthy, &runner, Some(100)).unwrap();
    assert!(!dir.file(wizard::STATE_FILE).exists());
    assert!(!Wizard::load(&dir, Some(100)).state().started);

    std::fs::write(dir.file(wizard::STATE_FILE), b"{ not json").unwrap();
    assert_eq!(Wizard::load(&dir, Some(100)).state().step, Step::Why, "a damaged file starts over");
}

#[test]
fn fixes_run_the_right_commands_behind_the_administrator_prompt() {
    let (_tmp, dir) = data_dir();
    let runner = RecordingRunner::default();
    let mut w = Wizard::load(&dir, Some(100));

    let bridge = replayed("bridge-active");
    let outcome = w.act(&Action::ApplyFix { fix: FixId::ThunderboltBridge }, &bridge, &runner, Some(100)).unwrap();
    assert!(matches!(outcome, Some(FixOutcome::Applied { .. })), "{outcome:?}");

    let ipv4 = replayed("missing-ipv4");
    // The IPv4 is derived from en4's hardware address 36:4d:04:ea:4e:40 (0x4e + 1, 0x40 + 1).
    let fix = w.view(&ipv4).fixes.into_iter().find(|f| f.id == FixId::LinkLocalIpv4).unwrap();
    assert_eq!(fix.commands, ["sudo ifconfig en4 inet 169.254.79.65 netmask 255.255.0.0 alias"]);
    w.act(&Action::ApplyFix { fix: FixId::LinkLocalIpv4 }, &ipv4, &runner, Some(100)).unwrap();

    let calls = runner.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            vec![
                "osascript".to_string(),
                "-e".into(),
                r#"do shell script "networksetup -setnetworkserviceenabled \"Thunderbolt Bridge\" off && ifconfig bridge0 down" with administrator privileges"#.into()
            ],
            vec![
                "osascript".to_string(),
                "-e".into(),
                r#"do shell script "ifconfig en4 inet 169.254.79.65 netmask 255.255.0.0 alias" with administrator privileges"#.into()
            ],
        ]
    );
    assert_eq!(saved(&dir)["fixes"].as_array().unwrap().len(), 2, "the outcomes are kept");

    // A fix the doctor does not call for is refused, and runs nothing.
    let healthy = replayed("healthy-two-macs");
    assert_eq!(
        w.act(&Action::ApplyFix { fix: FixId::LinkLocalIpv4 }, &healthy, &runner, Some(100)),
        Err(WizardError::FixNotOffered(FixId::LinkLocalIpv4))
    );
    assert_eq!(runner.calls.lock().unwrap().len(), 2);

    // A dismissed administrator prompt is a cancellation, not a failure.
    let cancelled =
        RecordingRunner { answer: Some(Err("execution error: User canceled. (-128)".into())), ..Default::default() };
    let outcome = w.act(&Action::ApplyFix { fix: FixId::ThunderboltBridge }, &bridge, &cancelled, Some(100)).unwrap();
    assert!(matches!(outcome, Some(FixOutcome::Cancelled { .. })), "{outcome:?}");

    // Where shoal cannot run them (not a Mac), the commands are only shown.
    let mut elsewhere = bridge.clone();
    elsewhere.platform = "linux".into();
    let runner = RecordingRunner::default();
    let outcome =
        w.act(&Action::ApplyFix { fix: FixId::ThunderboltBridge }, &elsewhere, &runner, Some(100)).unwrap().unwrap();
    let FixOutcome::ShowOnly { commands, .. } = outcome else { panic!("{outcome:?}") };
    assert_eq!(
        commands,
        ["sudo networksetup -setnetworkserviceenabled \"Thunderbolt Bridge\" off", "sudo ifconfig bridge0 down"]
    );
    assert!(runner.calls.lock().unwrap().is_empty());
}

#[test]
fn the_wizard_api_walks_the_steps_on_a_node() {
    let _one = common::cluster::exclusive();
    let mut c = TestCluster::with_network(1, Network::Loopback);
    c.start(0, &[]);
    c.wait_ready(0);
    let port = c.nodes[0].api_port;
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let url = format!("http://127.0.0.1:{port}/api/rdma/wizard");
    let post = |body: Value| -> (u16, Value) {
        let mut r = agent.post(&url).header("Content-Type", "application/json").send(body.to_string()).unwrap();
        (r.status().as_u16(), serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap())
    };

    let mut r = agent.get(&url).call().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let view: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(view["state"]["started"], false);
    assert_eq!(view["steps"].as_array().unwrap().len(), 6);
    assert_eq!(view["doctor"]["platform"], "linux");

    let (status, body) = post(json!({ "action": "next" }));
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("start"));
    assert_eq!(post(json!({ "action": "start" })).1["state"]["step"], "why");
    assert_eq!(post(json!({ "action": "next" })).1["state"]["step"], "prerequisites");
    let (status, body) = post(json!({ "action": "apply_fix", "fix": "thunderbolt_bridge" }));
    assert_eq!(status, 422, "nothing to fix on Linux: {body}");
    let (status, body) = post(json!({ "action": "jump" }));
    assert_eq!(status, 400, "{body}");
    for _ in 0..3 {
        post(json!({ "action": "next" }));
    }
    let (_, body) = post(json!({ "action": "next" }));
    assert_eq!(body["state"]["step"], "verify");
    assert_eq!(body["verification"]["result"], "not_a_mac");
    let file = c.nodes[0].data_dir.join(wizard::STATE_FILE);
    assert!(file.exists());

    // After the node restarts (the machine did not), the wizard is where it was.
    c.kill(0);
    c.start(0, &[]);
    c.wait_ready(0);
    let r: Value = serde_json::from_str(&agent.get(&url).call().unwrap().body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(r["state"]["step"], "verify");
    assert_eq!(post(json!({ "action": "reset" })).1["state"]["started"], false);
    c.wait_for(Duration::from_secs(1), "the state file to go", || !file.exists());
}
