//! Checks on what members say about instances, before any of it is used: a member holds the cluster
//! secret, but a bug or a rogue member must not make this node panic, write outside its models folder,
//! or take over another member's instance. Each check says what was wrong; the message is then dropped.

use super::InstanceInfo;
use crate::model::library::split_part;
use crate::model::names;
use crate::model::peer_copy::OfferedFile;
use crate::node::NodeId;
use crate::worker::supervisor::StageSpec;
use std::path::Path;

/// Most stages an instance may have (a cluster has at most a few dozen nodes).
const MAX_STAGES: usize = 256;
/// Most layers a model may have.
const MAX_LAYERS: usize = 4096;
/// Largest context, sequences and batch a stage may be asked for.
const MAX_CONTEXT: usize = 1 << 22;
const MAX_SEQUENCES: usize = 1024;
const MAX_BATCH: usize = 1 << 16;
const MAX_THREADS: usize = 1024;
/// Most tokens of saved prefixes a stage keeps in memory, in contexts per slot.
pub const SAVED_PREFIX_CONTEXTS: usize = 16;
/// Most parts a split set may have (llama.cpp numbers them with five digits; real sets have a few dozen).
const MAX_PARTS: usize = 1024;
/// Longest model name and instance id.
const MAX_NAME: usize = 256;

/// An instance id: short, and safe in a file name (worker logs are named after it).
pub fn instance_id(id: &str) -> Result<(), String> {
    let ok =
        !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then_some(()).ok_or_else(|| format!("{:?} is not an instance id", id.chars().take(80).collect::<String>()))
}

/// The name clients call an instance's model by: not empty, at most [`MAX_NAME`] bytes, and printable
/// (`shoal ps`, the dashboard and the logs print it: no escape sequences, bells or line breaks).
pub fn model_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("an instance's name has 1 to {MAX_NAME} bytes, not {}", name.len()));
    }
    if name.chars().any(char::is_control) {
        return Err(format!(
            "the name {:?} has control characters (escape, bell, line breaks, NUL…); choose a printable name (--name)",
            name.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

/// A stage an owner asks this node to run.
pub fn stage_spec(spec: &StageSpec) -> Result<(), String> {
    instance_id(&spec.instance)?;
    if spec.stages == 0 || spec.stages > MAX_STAGES || spec.stage >= spec.stages {
        return Err(format!("stage {} of {} does not exist", spec.stage, spec.stages));
    }
    if spec.layers.start >= spec.layers.end || spec.layers.end > MAX_LAYERS {
        return Err(format!("layers {:?} are not a range of a model's layers", spec.layers));
    }
    let sizes = [
        ("context", spec.context, MAX_CONTEXT),
        ("sequences", spec.sequences, MAX_SEQUENCES),
        ("batch", spec.batch, MAX_BATCH),
    ];
    for (what, value, max) in sizes {
        if value == 0 || value > max {
            return Err(format!("{what} {value} is outside 1..={max}"));
        }
    }
    let most_saved = spec.context * spec.sequences * SAVED_PREFIX_CONTEXTS;
    if spec.saved_prefix_tokens.is_some_and(|n| n > most_saved) {
        return Err(format!(
            "more than {most_saved} tokens of saved prefixes ({SAVED_PREFIX_CONTEXTS} contexts per slot)"
        ));
    }
    if spec.threads > MAX_THREADS {
        return Err(format!("{} threads is more than {MAX_THREADS}", spec.threads));
    }
    if let Some(n) = spec.draft_tokens.filter(|n| !(1..=crate::engine::MAX_DRAFT_TOKENS).contains(n)) {
        return Err(format!("{n} drafted tokens a step is outside 1..={}", crate::engine::MAX_DRAFT_TOKENS));
    }
    if let Some(tensor) = &spec.tensor {
        let shares_ok = tensor.shares.iter().all(|s| s.is_finite() && *s > 0.0 && *s <= 1e6);
        let group = tensor.shares.len();
        // A lone group's ranks are the instance's stages; a chained group's are some of them, and
        // its place is one of the ring's stages, which are fewer than the instance's.
        let placed = if tensor.ring_stages == 1 {
            tensor.ring_stage == 0 && tensor.rank == spec.stage && group == spec.stages
        } else {
            tensor.ring_stage < tensor.ring_stages && tensor.ring_stages < spec.stages && group < spec.stages
        };
        if tensor.rank >= group || group < 2 || !shares_ok || !placed || spec.ring.is_some() {
            return Err(format!(
                "rank {} of a tensor-parallel group with shares {:?} at stage {} of {} of the ring, as stage {} of {}",
                tensor.rank, tensor.shares, tensor.ring_stage, tensor.ring_stages, spec.stage, spec.stages
            ));
        }
    }
    if let Some(ring) = spec.ring {
        if ring.stage >= ring.stages || ring.stages < 2 || ring.stages >= spec.stages {
            return Err(format!(
                "stage {} of {} of the ring, as stage {} of {}",
                ring.stage, ring.stages, spec.stage, spec.stages
            ));
        }
    }
    let Some(file) = &spec.file else {
        return Err("the stage does not name its model file (name, size, repository)".into());
    };
    names::plain(&file.name).map_err(|e| e.to_string())?;
    if let Some(repo) = &file.repo {
        names::repo(repo).map_err(|e| e.to_string())?;
    }
    split_parts(file, &spec.parts)
}

/// The parts of a split set a stage names: as many as their names say, each a plain name of the form
/// `NAME-0000N-of-0000M.gguf` with one NAME, numbered in order, from the same repository, the first
/// being the stage's file; none when the file is not part of a set.
fn split_parts(file: &OfferedFile, parts: &[OfferedFile]) -> Result<(), String> {
    let Some((base, _, count)) = split_part(Path::new(&file.name)).filter(|(_, _, count)| *count > 1) else {
        return match parts {
            [] => Ok(()),
            _ => Err(format!("{} is not the first part of a split set, yet the stage names parts", file.name)),
        };
    };
    if parts.len() != count as usize || count as usize > MAX_PARTS {
        return Err(format!("{} is part of a set of {count} files; the stage names {} parts", file.name, parts.len()));
    }
    if parts[0] != *file {
        return Err("the first part named is not the stage's file".into());
    }
    for (index, part) in (1..).zip(parts) {
        names::plain(&part.name).map_err(|e| e.to_string())?;
        if split_part(Path::new(&part.name)) != Some((base.clone(), index, count)) {
            return Err(format!("{:?} is not part {index} of {count} of {base}", part.name));
        }
        if part.repo != file.repo || part.layers.is_some() {
            return Err(format!("{} is named with another repository, or as a shard", part.name));
        }
    }
    Ok(())
}

/// An instance as its owner `from` describes it. `existing` is this node's record of the same id;
/// `owner_gone`: its owner is down, so another member may take it over.
pub fn instance(
    info: &InstanceInfo,
    from: NodeId,
    existing: Option<&InstanceInfo>,
    owner_gone: bool,
) -> Result<(), String> {
    instance_id(&info.id)?;
    if info.owner != from {
        return Err(format!("it names {} as the owner, not the sender", info.owner.short()));
    }
    if let Some(existing) = existing.filter(|e| e.owner != from && !owner_gone) {
        return Err(format!("instance {} belongs to {}", info.id, existing.owner.short()));
    }
    if info.stages.is_empty() || info.stages.len() > MAX_STAGES {
        return Err(format!("{} stages (an instance has 1 to {MAX_STAGES})", info.stages.len()));
    }
    model_name(&info.model)?;
    if info.stages.iter().any(|s| s.layers.start >= s.layers.end || s.layers.end > MAX_LAYERS) {
        return Err("a stage has no layers".into());
    }
    if let Some(request) = &info.request {
        let sizes = [
            ("context", request.context, MAX_CONTEXT),
            ("sequences", request.sequences, MAX_SEQUENCES),
            ("threads", request.threads, MAX_THREADS),
        ];
        if let Some((what, value, max)) =
            sizes.into_iter().find_map(|(w, v, max)| v.filter(|v| *v > max).map(|v| (w, v, max)))
        {
            return Err(format!("it was launched with {what} {value}, more than {max}"));
        }
        let long = |text: &Option<String>| text.as_ref().is_some_and(|t| t.len() > MAX_NAME * 16);
        let nodes_long =
            request.nodes.as_ref().is_some_and(|n| n.len() > MAX_STAGES || n.iter().any(|n| n.len() > MAX_NAME));
        if long(&request.name) || long(&request.layers) || nodes_long {
            return Err("its launch request's name, layers or nodes are too long".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> StageSpec {
        StageSpec {
            instance: "ab12cd34".into(),
            stage: 0,
            stages: 2,
            model_path: "/owner/models/m.gguf".into(),
            layers: 0..10,
            context: 256,
            sequences: 4,
            batch: 512,
            kv_type: Default::default(),
            saved_prefix_tokens: Some(256 * 4),
            threads: 0,
            speculation: Default::default(),
            draft_tokens: None,
            file: Some(OfferedFile {
                name: "m.gguf".into(),
                size: 1,
                repo: None,
                sha256: None,
                layers: None,
                present: None,
            }),
            parts: Vec::new(),
            tensor: None,
            ring: None,
        }
    }

    fn part(name: &str) -> OfferedFile {
        OfferedFile {
            name: name.into(),
            size: 7,
            repo: Some("org/m".into()),
            sha256: None,
            layers: None,
            present: None,
        }
    }

    /// A stage of the set `m-0000N-of-00003.gguf` whose parts are named `names`.
    fn set_spec(names: &[&str]) -> StageSpec {
        let parts: Vec<OfferedFile> = names.iter().map(|n| part(n)).collect();
        StageSpec { file: Some(part("m-00001-of-00003.gguf")), parts, ..spec() }
    }

    #[test]
    fn the_parts_of_a_split_set_from_members_are_checked() {
        let good = ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"];
        assert_eq!(stage_spec(&set_spec(&good)), Ok(()));
        let bad: [&[&str]; 7] = [
            // A part that leads out of the models folder.
            &["m-00001-of-00003.gguf", "../x-00002-of-00003.gguf", "m-00003-of-00003.gguf"],
            &["m-00001-of-00003.gguf", "../m-00002-of-00003.gguf", "m-00003-of-00003.gguf"],
            &["m-00001-of-00003.gguf", "/etc/m-00002-of-00003.gguf", "m-00003-of-00003.gguf"],
            // Parts missing, repeated, out of order, or of another set.
            &["m-00001-of-00003.gguf", "m-00002-of-00003.gguf"],
            &["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00002-of-00003.gguf"],
            &["m-00001-of-00003.gguf", "m-00003-of-00003.gguf", "m-00002-of-00003.gguf"],
            &["m-00001-of-00003.gguf", "n-00002-of-00003.gguf", "m-00003-of-00003.gguf"],
        ];
        for names in bad {
            assert!(stage_spec(&set_spec(names)).is_err(), "{names:?}");
        }
        // The first part of a set without its other parts, and parts beside a single file.
        assert!(stage_spec(&set_spec(&[])).is_err());
        assert!(stage_spec(&StageSpec { parts: set_spec(&good).parts, ..spec() }).is_err());
        // A part from another repository, or named as a shard.
        let mut other = set_spec(&good);
        other.parts[2].repo = Some("org/other".into());
        assert!(stage_spec(&other).is_err());
        let mut shard = set_spec(&good);
        shard.parts[1].layers = Some("0-3".into());
        assert!(stage_spec(&shard).is_err());
    }

    #[test]
    fn a_member_takes_over_an_instance_only_when_its_owner_is_gone() {
        use crate::desktop::fixtures::{id, instance as record};
        let mine = record("m", crate::records::InstanceState::Ready, &[1.0, 1.0]);
        let taken = InstanceInfo { owner: id(2), ..mine.clone() };
        assert_eq!(instance(&mine, id(1), Some(&mine), false), Ok(()), "the owner speaks for its instance");
        assert!(instance(&taken, id(2), Some(&mine), false).is_err(), "a member cannot take a live owner's instance");
        assert_eq!(
            instance(&taken, id(2), Some(&mine), true),
            Ok(()),
            "a member takes over an instance whose owner is down"
        );
        assert!(instance(&taken, id(3), Some(&mine), true).is_err(), "only in its own name");
        let mut greedy = taken.clone();
        greedy.request = Some(crate::records::LaunchRequest { threads: Some(1 << 20), ..Default::default() });
        assert!(instance(&greedy, id(2), Some(&mine), true).is_err(), "its launch request is checked too");
    }

    #[test]
    fn stage_specs_from_members_are_checked() {
        use crate::worker::supervisor::{RingPlace, TensorRank};
        assert_eq!(stage_spec(&spec()), Ok(()));
        let rank = StageSpec { tensor: Some(TensorRank::alone(0, vec![1.0, 2.0])), ..spec() };
        assert_eq!(stage_spec(&rank), Ok(()));
        // A chain of three workers: a group of two at the ring's stage 0, a whole stage at its stage 1.
        let chained =
            |rank: usize| TensorRank { ring_stage: 0, ring_stages: 2, ..TensorRank::alone(rank, vec![1.0; 2]) };
        let follower = StageSpec { stage: 1, stages: 3, tensor: Some(chained(1)), ..spec() };
        assert_eq!(stage_spec(&follower), Ok(()));
        let whole = StageSpec { stage: 2, stages: 3, ring: Some(RingPlace { stage: 1, stages: 2 }), ..spec() };
        assert_eq!(stage_spec(&whole), Ok(()));
        let bad = [
            StageSpec { instance: "../x".into(), ..spec() },
            StageSpec { stage: 2, ..spec() },
            StageSpec { stages: 0, ..spec() },
            StageSpec { layers: 5..5, ..spec() },
            StageSpec { context: 0, ..spec() },
            StageSpec { batch: usize::MAX, ..spec() },
            StageSpec { saved_prefix_tokens: Some(256 * 4 * SAVED_PREFIX_CONTEXTS + 1), ..spec() },
            StageSpec { file: None, ..spec() },
            // A tensor-parallel rank that is not the stage, shares that do not count the ranks, a share
            // that is not a positive number.
            StageSpec { tensor: Some(TensorRank::alone(1, vec![1.0, 1.0])), ..spec() },
            StageSpec { tensor: Some(TensorRank::alone(0, vec![1.0])), ..spec() },
            StageSpec { tensor: Some(TensorRank::alone(0, vec![1.0, f64::NAN])), ..spec() },
            StageSpec { tensor: Some(TensorRank::alone(0, vec![1.0, 0.0])), ..spec() },
            // A group in a ring with as many stages as the instance has workers (its ranks would be
            // more); a ring place past the ring; a rank also given a whole stage's place; a whole
            // stage's place in a ring as long as the instance.
            StageSpec {
                tensor: Some(TensorRank { ring_stage: 1, ring_stages: 2, ..TensorRank::alone(0, vec![1.0, 1.0]) }),
                ..spec()
            },
            StageSpec { tensor: Some(TensorRank { ring_stage: 2, ..chained(1) }), ..follower.clone() },
            StageSpec { ring: Some(RingPlace { stage: 0, stages: 2 }), ..follower.clone() },
            StageSpec { ring: Some(RingPlace { stage: 2, stages: 2 }), ..whole.clone() },
            StageSpec { ring: Some(RingPlace { stage: 1, stages: 3 }), ..whole.clone() },
            StageSpec {
                file: Some(OfferedFile {
                    name: "../../x/evil.gguf".into(),
                    size: 1,
                    repo: None,
                    sha256: None,
                    layers: None,
                    present: None,
                }),
                ..spec()
            },
            StageSpec {
                file: Some(OfferedFile {
                    name: "m.gguf".into(),
                    size: 1,
                    repo: Some("../..".into()),
                    sha256: None,
                    layers: None,
                    present: None,
                }),
                ..spec()
            },
        ];
        for spec in bad {
            assert!(stage_spec(&spec).is_err(), "{spec:?}");
        }
    }
}
