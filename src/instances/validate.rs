//! Checks on what members say about instances, before any of it is used: a member holds the cluster
//! secret, but a bug or a rogue member must not make this node panic, write outside its models folder,
//! or take over another member's instance. Each check says what was wrong; the message is then dropped.

use super::InstanceInfo;
use crate::model::names;
use crate::node::NodeId;
use crate::worker::supervisor::StageSpec;

/// Most stages an instance may have (a cluster has at most a few dozen nodes).
const MAX_STAGES: usize = 256;
/// Most layers a model may have.
const MAX_LAYERS: usize = 4096;
/// Largest context, sequences and batch a stage may be asked for.
const MAX_CONTEXT: usize = 1 << 22;
const MAX_SEQUENCES: usize = 1024;
const MAX_BATCH: usize = 1 << 16;
const MAX_THREADS: usize = 1024;
/// Longest model name and instance id.
const MAX_NAME: usize = 256;

/// An instance id: short, and safe in a file name (worker logs are named after it).
pub fn instance_id(id: &str) -> Result<(), String> {
    let ok =
        !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then_some(()).ok_or_else(|| format!("{:?} is not an instance id", id.chars().take(80).collect::<String>()))
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
    if spec.threads > MAX_THREADS {
        return Err(format!("{} threads is more than {MAX_THREADS}", spec.threads));
    }
    let Some(file) = &spec.file else {
        return Err("the stage does not name its model file (name, size, repository)".into());
    };
    names::plain(&file.name).map_err(|e| e.to_string())?;
    if let Some(repo) = &file.repo {
        names::repo(repo).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// An instance as its owner `from` describes it. `existing` is this node's record of the same id.
pub fn instance(info: &InstanceInfo, from: NodeId, existing: Option<&InstanceInfo>) -> Result<(), String> {
    instance_id(&info.id)?;
    if info.owner != from {
        return Err(format!("it names {} as the owner, not the sender", info.owner.short()));
    }
    if let Some(existing) = existing.filter(|e| e.owner != from) {
        return Err(format!("instance {} belongs to {}", info.id, existing.owner.short()));
    }
    if info.stages.is_empty() || info.stages.len() > MAX_STAGES {
        return Err(format!("{} stages (an instance has 1 to {MAX_STAGES})", info.stages.len()));
    }
    if info.model.is_empty() || info.model.len() > MAX_NAME {
        return Err("its model name is empty or too long".into());
    }
    if info.stages.iter().any(|s| s.layers.start >= s.layers.end || s.layers.end > MAX_LAYERS) {
        return Err("a stage has no layers".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::peer_copy::OfferedFile;

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
            threads: 0,
            file: Some(OfferedFile { name: "m.gguf".into(), size: 1, repo: None, sha256: None, layers: None }),
        }
    }

    #[test]
    fn stage_specs_from_members_are_checked() {
        assert_eq!(stage_spec(&spec()), Ok(()));
        let bad = [
            StageSpec { instance: "../x".into(), ..spec() },
            StageSpec { stage: 2, ..spec() },
            StageSpec { stages: 0, ..spec() },
            StageSpec { layers: 5..5, ..spec() },
            StageSpec { context: 0, ..spec() },
            StageSpec { batch: usize::MAX, ..spec() },
            StageSpec { file: None, ..spec() },
            StageSpec {
                file: Some(OfferedFile {
                    name: "../../x/evil.gguf".into(),
                    size: 1,
                    repo: None,
                    sha256: None,
                    layers: None,
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
                }),
                ..spec()
            },
        ];
        for spec in bad {
            assert!(stage_spec(&spec).is_err(), "{spec:?}");
        }
    }
}
