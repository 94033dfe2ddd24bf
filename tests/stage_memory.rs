//! A stage maps only its own tensors, and only those pages of the model file become resident in it (as a
//! stage computing on the file in place does: `--no-repack`, and every stage where the kernel offers no
//! huge pages). Weights copied at load (into the repacked layout, or as they are into huge pages) leave
//! the file's pages. (Its own test binary: the resident-memory checks read this process's mappings of the
//! model files.)

mod common;

use shoal::engine::{Stage, StageInput, StageOptions};
use shoal::ggml::WeightPlacement;
use shoal::model::Model;

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

#[test]
fn a_middle_stage_maps_and_touches_only_its_layers() {
    let path = common::model_path();
    let model = Model::open(&path).unwrap();
    let header_bytes = model.file().tensors().iter().map(|t| t.offset).min().unwrap();
    let expected: u64 = model
        .file()
        .tensors()
        .iter()
        .filter(|t| layer_of(&t.name).is_some_and(|l| (10..20).contains(&l)))
        .map(|t| t.bytes)
        .sum();
    assert_eq!(model.layout().stage_bytes(10..20), expected);
    assert_eq!(model.layout().layers[10..20].iter().sum::<u64>(), expected);

    let options =
        StageOptions { context: 256, threads: 2, weights: WeightPlacement::AsInFile, ..StageOptions::default() };
    let mut stage = Stage::load(&model, 10..20, options).unwrap();
    assert_eq!(stage.weights().mapped_bytes(), expected);
    for name in stage.weights().tensor_names() {
        let layer = layer_of(name).unwrap_or_else(|| panic!("stage [10,20) mapped {name}"));
        assert!((10..20).contains(&layer), "stage [10,20) mapped {name}");
    }
    assert_eq!(stage.weights().tensor_names().len(), 10 * 9);

    let width = model.config().embedding;
    let hidden: Vec<f32> = (0..width * 4).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
    let out = stage.forward(0, 0, StageInput::Hidden { values: &hidden, tokens: 4 }).unwrap();
    assert_eq!(out.len(), width * 4);

    // The kernel maps file pages in folios and around each fault, so residency is coarser than the
    // tensors (on this machine a stage's 22 MB showed as 35 MB resident); the bound is what matters:
    // a stage with a third of the layers must not pull in most of the file.
    let resident = common::resident_bytes_of(&path);
    let file = model.file().file_bytes();
    eprintln!("stage bytes {expected}, header {header_bytes}, resident {resident}, file {file}");
    assert!(resident >= expected, "a forward pass reads all of the stage's {expected} bytes; only {resident} resident");
    assert!(resident < file / 2, "resident {resident} of the {file}-byte file, for a stage of {expected} bytes");
}

/// Prefault reads a stage's own tensors, not the other stages' bytes between them: layers 2-3 lie
/// apart in the file (blk.2 after blk.19, blk.3 after blk.29), with layers 20-29 between. Residency is
/// coarser than pages (the kernel maps around each fault), so the check compares with what touching
/// the whole span makes resident. (A copy of the file, so the other test's mappings do not count.)
#[test]
fn prefault_touches_only_the_stage_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("copy.gguf");
    std::fs::copy(common::model_path(), &path).unwrap();
    let model = Model::open(&path).unwrap();
    let options =
        StageOptions { context: 256, threads: 1, weights: WeightPlacement::AsInFile, ..StageOptions::default() };
    let stage = Stage::load(&model, 2..4, options).unwrap();
    let tensors: Vec<_> = stage.weights().tensor_names().iter().map(|n| model.file().tensor(n).unwrap()).collect();
    let start = tensors.iter().map(|t| t.offset).min().unwrap() as usize;
    let end = tensors.iter().map(|t| t.offset + t.bytes).max().unwrap() as usize;
    let own = stage.weights().mapped_bytes();
    assert!((end - start) as u64 > 4 * own, "the stage's tensors span {} bytes for {own} of its own", end - start);
    let before = common::resident_bytes_of(&path);
    let mut reports = Vec::new();
    stage.weights().prefault(|p| reports.push(p));
    assert_eq!(reports.last(), Some(&1.0));
    let prefaulted = common::resident_bytes_of(&path) - before;
    let mapping = model.file().mapping();
    let sum = (start..end).step_by(4096).fold(0u8, |sum, at| sum.wrapping_add(mapping[at]));
    std::hint::black_box(sum);
    let spanned = common::resident_bytes_of(&path) - before;
    eprintln!("stage bytes {own}, span {}, resident: prefault {prefaulted}, whole span {spanned}", end - start);
    assert!(prefaulted >= own, "prefault must read all {own} bytes of the stage; {prefaulted} became resident");
    assert!(prefaulted < spanned / 2, "prefault read the bytes between the stage's tensors");
}

/// A resident stage's repacked matrices (Gemma 3's Q4_K ones: src/ggml/repack.rs), and where the kernel
/// offers huge pages all its other weights too, are read once, into their copies, and leave the process's
/// mapping of the file: it holds fewer of the file's pages than the same stage on the file's layout, by
/// most of the copied bytes, and the copies together are the stage's weights. The two stages run one
/// after the other, each with a mapping of its own.
#[test]
fn copied_weights_leave_the_files_pages() {
    if !cfg!(all(target_arch = "x86_64", target_feature = "avx2")) {
        common::cannot_run("Gemma 3's Q4_K matrices are repacked on x86_64 with AVX2 (other CPUs: other types)");
        return;
    }
    let path = common::gemma3_path();
    let mut resident = Vec::new();
    let (mut repacked_bytes, mut copied_bytes, mut weight_bytes) = (0, 0, 0);
    for weights in [WeightPlacement::Automatic, WeightPlacement::AsInFile] {
        let model = Model::open(&path).unwrap();
        let options = StageOptions { context: 256, threads: 2, weights, ..StageOptions::default() };
        let mut reports = Vec::new();
        let stage = Stage::load_resident(&model, 0..18, options, None, |p| reports.push(p)).unwrap();
        assert!(reports.windows(2).all(|w| w[0] <= w[1]), "progress went back: {reports:?}");
        assert_eq!(reports.last(), Some(&1.0));
        repacked_bytes += stage.repacked_bytes();
        copied_bytes += stage.copied_bytes();
        if weights == WeightPlacement::Automatic {
            weight_bytes = stage.weights().mapped_bytes();
        }
        resident.push(common::resident_bytes_of(&path));
    }
    let [automatic, as_in_file] = resident[..] else { unreachable!() };
    eprintln!(
        "resident: {automatic} automatic, {as_in_file} as in the file; {repacked_bytes} bytes repacked, \
         {copied_bytes} copied into huge pages"
    );
    assert!(repacked_bytes > 0);
    if shoal::os::huge_pages_available() {
        assert_eq!(repacked_bytes + copied_bytes, weight_bytes, "every weight is repacked or copied");
    } else {
        assert_eq!(copied_bytes, 0, "no huge pages, no copies as they are");
        common::skipped("the copy of the weights into huge pages", common::AllowedSkip::NoHugePages);
    }
    let moved = repacked_bytes + copied_bytes;
    assert!(
        automatic + moved / 2 <= as_in_file,
        "the automatic stage holds {automatic} bytes of the file, the other {as_in_file}, {moved} copied"
    );
}
