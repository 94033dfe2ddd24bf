//! Every input a fuzz target crashed on (`tests/fixtures/fuzz/`), fed to its decoder: each now gets a
//! clear error (or, for the ring switch, is the harmless input it was), and replays through its target.

#[allow(dead_code)]
#[path = "../fuzz/targets.rs"]
mod targets;

use shoal::model::shard;
use shoal::placement;
use shoal::transport::ring::wire::Forward;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz").join(name))
        .expect("a fuzz fixture")
}

#[test]
fn a_last_layer_of_usize_max_is_refused_not_overflowed() {
    let input = fixture("shard-layers-overflow");
    let spec = std::str::from_utf8(&input[1..]).unwrap();
    assert_eq!(spec, "0-18446744073709551615");
    let err = shard::parse_layers(spec).unwrap_err();
    assert!(err.to_string().contains("write FIRST-LAST"), "{err}");
    assert!(shard::parse_layers("18446744073709551615").is_err());
    assert!(shard::parse_layers("18446744073709551615-18446744073709551616").is_err());
    assert_eq!(shard::parse_layers("18446744073709551614").unwrap(), usize::MAX - 1..usize::MAX);
    targets::shard(&input);

    let input = fixture("placement-layers-overflow");
    let spec = std::str::from_utf8(&input[1..]).unwrap();
    let err = placement::parse_layers(spec).unwrap_err();
    assert!(err.to_string().contains("is not NODE:FIRST-LAST"), "{err}");
    targets::shard(&input);
}

#[test]
fn a_shard_record_with_an_empty_or_reversed_layer_range_is_refused() {
    let input = fixture("shard-record-reversed-layers");
    let err = shard::parse_record(&input[1..]).unwrap_err();
    assert!(err.contains("layer ranges"), "{err}");
    let record = |layers: &str| {
        format!(r#"{{"source":"","size":10,"sha256":null,"header_bytes":0,"layers":{layers},"present":[]}}"#)
    };
    for layers in [r#"[{"start":3,"end":3}]"#, r#"[{"start":4,"end":6},{"start":0,"end":2}]"#] {
        assert!(shard::parse_record(record(layers).as_bytes()).is_err(), "{layers}");
    }
    let good = shard::parse_record(record(r#"[{"start":0,"end":2},{"start":4,"end":6}]"#).as_bytes()).unwrap();
    assert_eq!(good.layers_text(), "0-1, 4-5");
    targets::shard(&input);
}

#[test]
fn a_ring_switch_with_trailing_bytes_decodes_as_the_switch() {
    let input = fixture("ring-switch-trailing-bytes");
    assert_eq!(
        Forward::decode(&input).unwrap(),
        Forward::Switch { from: u64::from_le_bytes([0, 0, 0, 6, 0, 0, 0, 4]) }
    );
    targets::ring(&input);
}

#[test]
fn hidden_states_with_a_nonzero_reserved_field_are_refused() {
    let input = fixture("hidden-reserved-nonzero");
    assert_eq!(&input[2..4], &[0, 58]);
    let err = shoal::engine::HiddenStates::decode(&input).unwrap_err();
    assert_eq!(err, shoal::engine::hidden::HiddenError::Reserved(0x3a00));
    assert!(err.to_string().contains("reserved field"), "{err}");
    targets::ring(&input);
}

#[test]
fn a_begin_frame_whose_temperature_overflows_to_infinity_is_refused() {
    // The fuzzer's input: a Begin frame whose JSON temperature (4444…0.0) reads as an infinite f32, which
    // would have been encoded again as `null`.
    let input = fixture("ring-begin-infinite-temperature");
    let frame = shoal::transport::RingFrame::decode(&input);
    match frame {
        Err(shoal::transport::RingFrameError::Malformed(why)) => assert!(why.contains("temperature"), "{why}"),
        other => panic!("the frame was not refused: {other:?}"),
    }
    targets::ring(&input);
}
