//! `shoal doctor` on replayed Mac outputs (tests/fixtures/rdma) gives the expected verdicts, a missing
//! file makes its checks unknown, and on this Linux machine it says plainly that there is no RDMA.

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn folder(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rdma").join(name)
}

fn replay(dir: &Path) -> Value {
    let out = common::shoal().args(["doctor", "--json", "--replay"]).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn verdicts(report: &Value) -> BTreeMap<String, String> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap().to_string(), c["verdict"].as_str().unwrap().to_string()))
        .collect()
}

fn expect(name: &str, failing: &[&str], usable: &[&str]) -> Value {
    let report = replay(&folder(name));
    let v = verdicts(&report);
    for (id, verdict) in &v {
        let want = if failing.contains(&id.as_str()) { "fail" } else { "pass" };
        assert_eq!(verdict, want, "{name}: check {id}\n{report:#}");
    }
    for id in failing {
        assert!(v.contains_key(*id), "{name}: no check {id}");
    }
    let got: Vec<&str> = report["usable_interfaces"].as_array().unwrap().iter().map(|i| i.as_str().unwrap()).collect();
    assert_eq!(got, usable, "{name}");
    report
}

#[test]
fn replayed_setups_get_the_right_verdicts() {
    let healthy = expect("healthy-two-macs", &[], &["en4"]);
    let link = &healthy["links"][0];
    assert_eq!(link["receptacle"], 3);
    assert_eq!(link["interface"], "en4");
    assert_eq!(link["peer_domain_uuid"], "88F10ACA-5CAA-4F5D-8361-03EED54ACB5A");
    assert_eq!(healthy["checks"].as_array().unwrap().len(), 9);

    let disabled = expect("rdma-disabled", &["rdma_ctl", "rdma_devices", "rdma_ports"], &[]);
    let fix = disabled["checks"].as_array().unwrap().iter().find(|c| c["id"] == "rdma_ctl").unwrap()["fix"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(fix.contains("Recovery") && fix.contains("rdma_ctl enable"), "{fix}");

    let bridge = expect("bridge-active", &["thunderbolt_bridge"], &["en4"]);
    let reason = bridge["checks"].as_array().unwrap().iter().find(|c| c["id"] == "thunderbolt_bridge").unwrap()
        ["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reason.contains("en2, en3, en4"), "{reason}");

    let ipv4 = expect("missing-ipv4", &["ipv4"], &[]);
    let fix = ipv4["checks"].as_array().unwrap().iter().find(|c| c["id"] == "ipv4").unwrap()["fix"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(fix.contains("sudo ifconfig en4 inet 169.254."), "{fix}");

    expect("thunderbolt4", &["thunderbolt5", "peer_rdma", "rdma_devices", "rdma_ports"], &[]);
}

#[test]
fn a_missing_capture_makes_its_checks_unknown() {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(folder("healthy-two-macs")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "rdma_ctl_status.txt" && entry.file_name() != "ifconfig.txt" {
            std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
        }
    }
    let v = verdicts(&replay(tmp.path()));
    assert_eq!(v["rdma_ctl"], "unknown");
    assert_eq!(v["thunderbolt_bridge"], "unknown");
    assert_eq!(v["macos_version"], "pass");
    assert!(!v.contains_key("ipv4"), "the IPv4 check needs ifconfig");
}

#[test]
fn on_this_linux_machine_the_doctor_says_there_is_no_rdma() {
    let out = common::shoal().arg("doctor").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no RDMA devices"), "{text}");
    assert!(text.contains("shoal uses TCP"), "{text}");
    let out = common::shoal().args(["doctor", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdicts(&report)["rdma_devices"], "fail");
    assert_eq!(report["usable_interfaces"].as_array().unwrap().len(), 0);
}

#[test]
fn replaying_a_missing_folder_is_a_clear_error() {
    let out = common::shoal().args(["doctor", "--replay", "/nonexistent/captures"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a folder"));
}

/// The Mac Studio side of the healthy folder's cable: its bus 88F1… on receptacle 2, the Mac mini
/// (bus 7F15…) across it advertising rdma.
const STUDIO_THUNDERBOLT: &str = "Thunderbolt/USB4:

    Thunderbolt/USB4 Bus 1:

      Vendor Name: Apple Inc.
      Device Name: Mac Studio
      Domain UUID: 88F10ACA-5CAA-4F5D-8361-03EED54ACB5A
      Port:
          Status: Device connected
          Link Status: 0x2
          Speed: 80 Gb/s
          Receptacle: 2

        Mac mini:

          Vendor Name: Apple Inc.
          Device Name: Mac16,11
          Domain UUID: 7F158861-C131-4D0D-83B6-CA50EF76C32B
          Services:
            Service: Unknown:
              Protocol ID: 64087
              Service Key: rdma
";

#[test]
fn the_cluster_matches_cables_by_domain_and_checks_builds_and_mesh() {
    use shoal::node::NodeId;
    use shoal::rdma::{self, Captures, NodeRdma, Verdict};
    let mini = rdma::doctor(&Captures::replay(&folder("healthy-two-macs")).unwrap());
    let mut studio_captures = Captures::replay(&folder("healthy-two-macs")).unwrap();
    studio_captures.thunderbolt = Some(STUDIO_THUNDERBOLT.into());
    // On the Studio, receptacle 2 is "Thunderbolt 2" → en3.
    studio_captures.ibv_devinfo = studio_captures.ibv_devinfo.map(|t| t.replace("rdma_en4", "rdma_en3"));
    studio_captures.ifconfig = studio_captures.ifconfig.map(|t| t.replace("en4", "en3"));
    let studio = rdma::doctor(&studio_captures);
    assert_eq!(studio.usable_interfaces, ["en3"], "{studio:#?}");
    let (a, b, c) = (NodeId::random(), NodeId::random(), NodeId::random());
    let node = |id, name: &str, report: &rdma::NodeReport| NodeRdma {
        node: id,
        name: name.into(),
        report: Some(report.clone()),
    };

    let pair = rdma::assess(vec![node(a, "mini", &mini), node(b, "studio", &studio)]);
    assert_eq!(pair.cables.len(), 1, "{pair:#?}");
    let cable = &pair.cables[0];
    assert_eq!((cable.a_receptacle, cable.b_receptacle), (Some(3), Some(2)));
    assert!(cable.rdma_ready);
    let verdict = |r: &rdma::ClusterRdma, id: &str| r.checks.iter().find(|c| c.id == id).unwrap().verdict;
    assert_eq!(verdict(&pair, "same_build"), Verdict::Pass);
    assert_eq!(verdict(&pair, "full_mesh"), Verdict::Pass);

    let mut newer = mini.clone();
    newer.macos.as_mut().unwrap().build = "25D12".into();
    newer.links.clear();
    let trio = rdma::assess(vec![node(a, "mini", &mini), node(b, "studio", &studio), node(c, "third", &newer)]);
    assert_eq!(verdict(&trio, "same_build"), Verdict::Fail);
    let mesh = trio.checks.iter().find(|c| c.id == "full_mesh").unwrap();
    assert_eq!(mesh.verdict, Verdict::Fail);
    assert!(mesh.reason.contains("mini — third") && mesh.reason.contains("studio — third"), "{}", mesh.reason);
}
