//! Every parser over every recorded output in tests/fixtures/macos.

use super::*;

macro_rules! fixture {
    ($path:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/macos/", $path))
    };
}

#[test]
fn sw_vers_reads_version_and_build() {
    let v = sw_vers(fixture!("verbatim/sw_vers_macos_26_2.txt")).unwrap();
    assert_eq!(v, MacOsVersion { version: "26.2".into(), build: "25C56".into() });
    assert!(v.at_least(26, 2) && !v.at_least(26, 3));
    assert_eq!(sw_vers("BuildVersion: 25A1\n  ProductVersion:   26.3.1  \n").unwrap().numbers(), (26, 3, 1));
    assert_eq!(sw_vers("garbage"), None);
}

#[test]
fn rdma_ctl_status_words() {
    assert_eq!(rdma_ctl_status(fixture!("reconstructed/rdma_ctl_status_enabled.txt")), Some(true));
    assert_eq!(rdma_ctl_status(fixture!("reconstructed/rdma_ctl_status_disabled.txt")), Some(false));
    assert_eq!(rdma_ctl_status("  Enabled \n"), Some(true));
    assert_eq!(rdma_ctl_status("command not found"), None);
}

#[test]
fn ibv_devices_in_every_recorded_layout() {
    let names = |text| match ibv_devices(text) {
        DeviceList::Devices(d) => d,
        DeviceList::Unsupported(e) => panic!("{e}"),
    };
    assert_eq!(names(fixture!("verbatim/tn3205_ibv_devices_m4pro_macmini.txt")), ["rdma_en2", "rdma_en3", "rdma_en4"]);
    let m3 = ["rdma_en2", "rdma_en3", "rdma_en5", "rdma_en4", "rdma_en6", "rdma_en7"];
    assert_eq!(names(fixture!("verbatim/mlx_docs_ibv_devices_m3ultra.txt")), m3);
    assert_eq!(names(fixture!("reconstructed/ibv_devices_m3ultra_rdmacore_format.txt")), m3);
    assert!(names(fixture!("reconstructed/ibv_devices_header_only_rdma_disabled_or_tb4.txt")).is_empty());
    assert!(matches!(
        ibv_devices(fixture!("verbatim/linux_ibv_devices_no_rdma_kernel_debian12.txt")),
        DeviceList::Unsupported(_)
    ));
}

#[test]
fn ibv_devinfo_ports_and_gids() {
    let four = ibv_devinfo(fixture!("verbatim/tn3205_ibv_devinfo_4x_m4pro_excerpt.txt"));
    assert_eq!(four.len(), 3);
    assert!(four
        .iter()
        .all(|d| d.port_state.as_deref() == Some("PORT_ACTIVE") && d.transport.as_deref() == Some("Thunderbolt")));
    let two = ibv_devinfo(fixture!("reconstructed/ibv_devinfo_mac_two_ports_reconstructed.txt"));
    assert_eq!(two[1].name, "rdma_en3");
    assert_eq!(two[1].port_state.as_deref(), Some("PORT_DOWN"));
    assert_eq!(two[0].active_mtu, Some(4096));
    assert_eq!(two[0].link_layer.as_deref(), Some("Thunderbolt"));
    let v = ibv_devinfo(fixture!("verbatim/tn3205_ibv_devinfo_v_rdma_en2_excerpt.txt"));
    assert_eq!(v[0].name, "rdma_en2");
    assert_eq!(v[0].port_state.as_deref(), Some("PORT_ACTIVE"));
    assert_eq!(v[0].gids.get(&1).map(String::as_str), Some("::ffff:169.254.205.255"));
    assert!(ibv_devinfo(fixture!("reconstructed/ibv_devinfo_no_devices.stderr.txt")).is_empty());
    assert!(ibv_devinfo(fixture!("verbatim/linux_ibv_devinfo_no_rdma_kernel_debian12.txt")).is_empty());
}

#[test]
fn thunderbolt_buses_with_their_speeds_and_peers() {
    let studio = thunderbolt(fixture!(
        "verbatim/system_profiler_SPThunderboltDataType_mac16_9_macos26_6_2_blanklines_stripped.txt"
    ));
    assert_eq!(studio.len(), 4, "{studio:#?}");
    let by_receptacle = |r| studio.iter().find(|b| b.receptacle == Some(r)).unwrap();
    assert_eq!(by_receptacle(3).speed, Some(Speed { gbps: 120, up_to: true }));
    assert!(!by_receptacle(3).connected);
    assert_eq!(by_receptacle(2).speed, Some(Speed { gbps: 80, up_to: false }));
    assert_eq!(by_receptacle(1).speed, Some(Speed { gbps: 40, up_to: false }));
    assert_eq!(by_receptacle(2).domain_uuid.as_deref(), Some("F0E70B19-FEF6-4E80-9754-ED5FE0E04690"));
    // Docks and disks are not Macs: no peer.
    assert!(studio.iter().all(|b| b.peer.is_none()), "{studio:#?}");

    let mini = thunderbolt(fixture!(
        "verbatim/system_profiler_SPThunderboltDataType_exo1390_macmini_peer_macstudio_partial.txt"
    ));
    let linked = &mini[0];
    assert_eq!(linked.receptacle, Some(3));
    assert!(linked.connected);
    assert_eq!(linked.speed, Some(Speed { gbps: 80, up_to: false }));
    let peer = linked.peer.as_ref().unwrap();
    assert_eq!(peer.domain_uuid, "88F10ACA-5CAA-4F5D-8361-03EED54ACB5A");
    assert!(peer.rdma_service);
    assert_eq!(mini[1].domain_uuid.as_deref(), Some("0A3248FD-13DA-4F5B-9167-7C469F35421C"));
}

#[test]
fn ifconfig_addresses_status_and_bridge_members() {
    let en2 = ifconfig(fixture!("verbatim/tn3205_ifconfig_en2.txt"));
    assert_eq!(en2["en2"].ipv4, ["169.254.205.255"]);
    assert_eq!(en2["en2"].active, Some(true));
    assert!(en2["en2"].up);
    let bridge = ifconfig(fixture!("verbatim/tn3205_ifconfig_bridge0_excerpt.txt"));
    assert_eq!(bridge["bridge0"].members, ["en2", "en3", "en4"]);
    assert_eq!(bridge["bridge0"].active, Some(true));
}
