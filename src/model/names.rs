//! Names of model files and repositories that come from elsewhere — another member, the API, the hub —
//! checked before they become paths. A file name is one plain path component (no `/`, `\`, `..`, `.`,
//! NUL, nothing absolute); a repository is `ORG/NAME`, two such components; a hub file may sit in
//! sub-folders of its repository, each of them plain. Paths built from them are resolved under the
//! models folder and checked again after canonicalisation (a symbolic link inside the folder cannot lead
//! out of it).

use std::path::{Component, Path, PathBuf};

/// Longest name accepted (file systems allow 255 bytes per component).
const MAX_COMPONENT: usize = 255;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{0:?} is not a plain file name (no folders, `..`, `\\`, NUL or absolute paths); refused")]
    NotPlain(String),
    #[error("{0:?} is not a repository name like ORG/NAME; refused")]
    NotRepo(String),
    #[error("{path} would be outside the models folder {root}; refused")]
    Outside { path: String, root: String },
    #[error("cannot check where {path} leads: {error}")]
    Unresolvable { path: String, error: String },
}

/// `name` if it is one plain path component.
pub fn plain(name: &str) -> Result<&str, NameError> {
    let bad = name.is_empty()
        || name.len() > MAX_COMPONENT
        || name == "."
        || name == ".."
        || name.contains(['/', '\\', '\0'])
        || name.chars().any(char::is_control)
        || Path::new(name).components().count() != 1
        || !matches!(Path::new(name).components().next(), Some(Component::Normal(_)));
    if bad {
        Err(NameError::NotPlain(shown(name)))
    } else {
        Ok(name)
    }
}

/// `repo` if it is `ORG/NAME` with both parts plain.
pub fn repo(repo: &str) -> Result<&str, NameError> {
    match repo.split_once('/') {
        Some((org, name)) if plain(org).is_ok() && plain(name).is_ok() => Ok(repo),
        _ => Err(NameError::NotRepo(shown(repo))),
    }
}

/// A hub file's path inside its repository (`FILE` or `FOLDER/…/FILE`), each part plain.
pub fn relative(path: &str) -> Result<&str, NameError> {
    if path.split('/').all(|part| plain(part).is_ok()) {
        Ok(path)
    } else {
        Err(NameError::NotPlain(shown(path)))
    }
}

/// Where the file `name` (of repository `repo`, when known) goes under `models_dir`: checked names,
/// and a path that stays inside `models_dir` once every link on the way is resolved.
pub fn destination(models_dir: &Path, repo_name: Option<&str>, name: &str) -> Result<PathBuf, NameError> {
    plain(name)?;
    let folder = match repo_name {
        Some(r) => models_dir.join(repo(r)?.replace('/', "--")),
        None => models_dir.to_path_buf(),
    };
    let path = folder.join(name);
    check_inside(models_dir, &path)?;
    Ok(path)
}

/// Fails unless `path` (which need not exist yet) stays inside `root` after canonicalisation of the
/// deepest part of it that exists.
pub fn check_inside(root: &Path, path: &Path) -> Result<(), NameError> {
    let unresolvable =
        |p: &Path, e: std::io::Error| NameError::Unresolvable { path: p.display().to_string(), error: e.to_string() };
    std::fs::create_dir_all(root).map_err(|e| unresolvable(root, e))?;
    let root_real = root.canonicalize().map_err(|e| unresolvable(root, e))?;
    // The deepest existing ancestor (the file itself when it exists: a link there must not lead out).
    let mut existing = path;
    let mut rest = Vec::new();
    while std::fs::symlink_metadata(existing).is_err() {
        let (Some(parent), Some(last)) = (existing.parent(), existing.file_name()) else { break };
        rest.push(last.to_owned());
        existing = parent;
    }
    let mut real = existing.canonicalize().map_err(|e| unresolvable(existing, e))?;
    for part in rest.iter().rev() {
        if Path::new(part).components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(NameError::NotPlain(shown(&part.to_string_lossy())));
        }
        real.push(part);
    }
    if real.starts_with(&root_real) {
        Ok(())
    } else {
        Err(NameError::Outside { path: path.display().to_string(), root: root.display().to_string() })
    }
}

fn shown(name: &str) -> String {
    name.chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_pass() {
        for ok in ["model.gguf", "SmolLM2-135M.Q4_1.gguf", "a..b.gguf", ".hidden.gguf"] {
            assert_eq!(plain(ok), Ok(ok));
        }
        for bad in ["", ".", "..", "../x", "a/b", "/tmp/x/authorized_keys", "a\\b", "a\0b", "a\nb", &"x".repeat(256)] {
            assert!(plain(bad).is_err(), "{bad:?}");
        }
        assert!(repo("org/name").is_ok());
        for bad in ["org", "org/../x", "../x", "org/name/more", "/name", "org/"] {
            assert!(repo(bad).is_err(), "{bad:?}");
        }
        assert!(relative("Q4/model-00001-of-00002.gguf").is_ok());
        for bad in ["../x.gguf", "a/../../x", "/abs.gguf", "a//b", ""] {
            assert!(relative(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn destinations_stay_in_the_models_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let models = tmp.path().join("models");
        let path = destination(&models, Some("org/name"), "m.gguf").unwrap();
        assert_eq!(path, models.join("org--name").join("m.gguf"));
        assert!(destination(&models, None, "../evil.gguf").is_err());
        assert!(destination(&models, Some("../.."), "m.gguf").is_err());
        // A link inside the folder that leads out of it is caught after canonicalisation.
        #[cfg(unix)]
        {
            let outside = tmp.path().join("outside");
            std::fs::create_dir_all(&outside).unwrap();
            std::os::unix::fs::symlink(&outside, models.join("org--link")).unwrap();
            let escaped = destination(&models, Some("org/link"), "m.gguf");
            assert!(matches!(escaped, Err(NameError::Outside { .. })), "{escaped:?}");
        }
    }
}
