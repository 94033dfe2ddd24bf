//! A sequence's cached prefix copied out of a stage and written back (the prompt cache's saved
//! prefixes, issue 47): written into another sequence after its own was overwritten, it gives the same
//! logits, bit for bit, as the sequence that computed it — for SmolLM2 with F16 and Q8_0 caches (any
//! shorter prefix too) and for Qwen3.5's recurrent state (only whole). A copy of the wrong size, a
//! state asked back in part, and a stage's store told to keep more than its budget are refused or
//! bounded.

mod common;

use common::oracle;
use shoal::engine::{KvType, Stage, StageInput, StageOptions};
use shoal::model::Model;
use shoal::transport::PrefixOp;
use shoal::worker::compute::{Budget, PrefixStore};
use std::path::Path;

fn stage(model: &Path, kv_type: KvType) -> Stage {
    let file = Model::open(model).unwrap();
    let options = StageOptions { context: 256, sequences: 2, kv_type, ..oracle::options() };
    Stage::load(&file, 0..file.config().layers, options).unwrap()
}

fn prompt(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 100 + (i * 37) % 900).collect()
}

/// Logits of `then` at position `at` of `seq`, after whatever the sequence holds.
fn next(stage: &mut Stage, seq: usize, at: usize, then: &[u32]) -> Vec<f32> {
    stage.forward(seq, at, StageInput::Tokens(then)).unwrap().to_vec()
}

fn check(model: &Path, kv_type: KvType, shorter: Option<usize>) {
    let p = prompt(40);
    let mut reference = stage(model, kv_type);
    reference.forward(0, 0, StageInput::Tokens(&p)).unwrap();
    let want = next(&mut reference, 0, 40, &[7]);

    let mut s = stage(model, kv_type);
    s.forward(0, 0, StageInput::Tokens(&p)).unwrap();
    let saved = s.save_prefix(0, 40).unwrap();
    assert_eq!(saved.len(), s.prefix_bytes(40));
    // The sequence that computed it moves on to something else entirely.
    s.forward(0, 0, StageInput::Tokens(&prompt(60)[20..])).unwrap();
    s.restore_prefix(1, 40, 40, &saved).unwrap();
    assert_eq!(s.len(1), 40);
    assert_eq!(next(&mut s, 1, 40, &[7]), want, "{}: written back whole", kv_type.name());

    if let Some(n) = shorter {
        let mut reference = stage(model, kv_type);
        reference.forward(0, 0, StageInput::Tokens(&p[..n])).unwrap();
        let want = next(&mut reference, 0, n, &[7]);
        s.restore_prefix(0, 40, n, &saved).unwrap();
        assert_eq!(next(&mut s, 0, n, &[7]), want, "{}: the first {n} positions of it", kv_type.name());
    }
    assert!(s.restore_prefix(1, 40, 40, &saved[1..]).is_err(), "a copy of the wrong size");
    assert!(s.restore_prefix(1, 39, 39, &saved).is_err(), "a copy of other positions");
}

#[test]
fn a_saved_prefix_written_back_gives_the_logits_of_the_sequence_that_computed_it() {
    let model = common::model_path();
    check(&model, KvType::F16, Some(25));
    check(&model, KvType::Q8_0, Some(25));
}

#[test]
fn a_recurrent_state_is_saved_and_given_back_only_whole() {
    let model = common::random_model::qwen35().write();
    check(&model, KvType::F16, None);
    let mut s = stage(&model, KvType::F16);
    s.forward(0, 0, StageInput::Tokens(&prompt(40))).unwrap();
    assert!(s.save_prefix(0, 30).is_err(), "a state after 40 positions is not one after 30");
    let saved = s.save_prefix(0, 40).unwrap();
    assert!(s.restore_prefix(1, 40, 30, &saved).is_err(), "a state cannot be cut back");
}

/// Stage 0 keeps every stage within its budget; a stage's store also bounds itself, whatever the ring
/// says: the oldest copy goes first.
#[test]
fn a_stores_memory_is_bounded_whatever_the_frames_say() {
    let model = common::model_path();
    let mut s = stage(&model, KvType::F16);
    let mut store = PrefixStore::new(None, Budget { memory: 100, disk: 0, state_cost: 0 });
    let save = |s: &mut Stage, store: &mut PrefixStore, tokens: &[u32]| {
        s.forward(0, 0, StageInput::Tokens(tokens)).unwrap();
        let key = shoal::worker::compute::prefix_key(tokens);
        let op = PrefixOp::Save { key, positions: tokens.len() as u32, tokens: tokens.to_vec() };
        store.apply(s, 0, &op).unwrap();
        key
    };
    let restore = |s: &mut Stage, store: &mut PrefixStore, key: u64| {
        store.apply(s, 1, &PrefixOp::Restore { key, saved: 60, positions: 60, failed: None })
    };
    let first = save(&mut s, &mut store, &prompt(60));
    restore(&mut s, &mut store, first).unwrap();
    let second = save(&mut s, &mut store, &prompt(61)[1..]);
    assert!(restore(&mut s, &mut store, first).unwrap_err().contains("not in this stage's memory"));
    restore(&mut s, &mut store, second).unwrap();
    // A save whose tokens are not its key's is refused.
    let forged = PrefixOp::Save { key: 1, positions: 60, tokens: prompt(60) };
    assert!(store.apply(&mut s, 0, &forged).is_err());
    assert!(store.apply(&mut s, 9, &PrefixOp::Forget { key: 1, memory: true, disk: true }).is_err(), "no slot 9");
}
