//! The prolog, the epilog, slurmstepd's task entry and the PAM session module load the admin's
//! config on every job or session, and parsing and validating the TOML grows with the number of
//! tenants (about 0.5 ms of CPU per process for a hundred). So the validated config is kept,
//! serialized, in a root-only folder under /run ([`CACHE_DIR`]), keyed by the SHA-256 of the
//! file's path and text and of the types' schema
//! ([`tenancy_config::SCHEMA`]): the TOML is still read on every job, and any change to it, or a
//! build with other types, misses the cache and parses again. Nothing else is trusted from the
//! cache: it is used only by root, only from a folder and file that root owns and nobody else
//! may write, and a cache that cannot be read, written or trusted only costs the parse.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use tenancy_config::{Config, ConfigError};

/// Where the validated configs are kept (/run: a tmpfs emptied at boot on systemd nodes).
pub const CACHE_DIR: &str = "/run/slurm-tenancy";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    key: String,
    config: Config,
}

/// [`Config::load`] through the cache in [`CACHE_DIR`] when this process is root (the prolog,
/// the epilog, slurmstepd's task entry, the PAM session); others parse.
pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
    let path = Config::find(explicit)?;
    if !rustix::process::geteuid().is_root() {
        return Config::from_file(&path);
    }
    load_via(&path, Path::new(CACHE_DIR)).map(|(c, _)| c)
}

/// Loads `path` through the cache in `dir`; the flag says whether the cache answered.
pub fn load_via(path: &Path, dir: &Path) -> Result<(Config, bool), ConfigError> {
    let text = fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let key = key(path, &text);
    let file = dir.join(file_name(path));
    if let Some(mut config) = read(dir, &file, &key) {
        config.path = path.to_path_buf();
        return Ok((config, true));
    }
    let entry = Entry {
        key,
        config: Config::parse(&text, path)?,
    };
    // A cache that cannot be written only costs the next process the parse.
    if write(dir, &file, &entry).is_ok() {
        prune(dir, &file);
    }
    Ok((entry.config, false))
}

/// Removes the entries of configs whose file is gone (a node whose config moved; tests), so the
/// folder keeps one entry per config in use. Runs only when an entry was written.
fn prune(dir: &Path, kept: &Path) {
    #[derive(Deserialize)]
    struct Head {
        config: Source,
    }
    #[derive(Deserialize)]
    struct Source {
        path: std::path::PathBuf,
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        // Entries only: a link or anything else there is left alone, and never followed.
        let is_file = e.file_type().is_ok_and(|t| t.is_file());
        if p == kept || !is_file || !name.starts_with("config-") || !name.ends_with(".json") {
            continue;
        }
        let gone = fs::read(&p)
            .ok()
            .and_then(|b| serde_json::from_slice::<Head>(&b).ok())
            .is_none_or(|h| !h.config.path.exists());
        if gone {
            let _ = fs::remove_file(&p);
        }
    }
}

fn key(path: &Path, text: &str) -> String {
    let mut h = Sha256::new();
    h.update(tenancy_config::SCHEMA.as_bytes());
    h.update([0]);
    h.update(path.as_os_str().as_encoded_bytes());
    h.update([0]);
    h.update(text.as_bytes());
    hex::encode(h.finalize())
}

/// One file per config path.
fn file_name(path: &Path) -> String {
    let h = Sha256::digest(path.as_os_str().as_encoded_bytes());
    format!("config-{}.json", hex::encode(&h[..8]))
}

/// Root's own, and writable by nobody else.
fn trusted(meta: &fs::Metadata) -> bool {
    meta.uid() == 0 && meta.mode() & 0o022 == 0
}

fn read(dir: &Path, file: &Path, key: &str) -> Option<Config> {
    let dir_meta = fs::symlink_metadata(dir).ok()?;
    if !dir_meta.is_dir() || !trusted(&dir_meta) {
        return None;
    }
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(file)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || !trusted(&meta) {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.read_to_end(&mut bytes).ok()?;
    let entry: Entry = serde_json::from_slice(&bytes).ok()?;
    (entry.key == key).then_some(entry.config)
}

fn write(dir: &Path, file: &Path, entry: &Entry) -> std::io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let dir_meta = fs::symlink_metadata(dir)?;
    if !dir_meta.is_dir() || !trusted(&dir_meta) {
        return Err(std::io::Error::other("cache folder not root's own"));
    }
    let bytes = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{}.{name}", std::process::id()));
    let written = (|| {
        let mut f: File = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        fs::rename(&tmp, file)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;
    use tenancy_test_support::{requires_root, TenancyToml};

    fn toml() -> String {
        let mut c = TenancyToml::under("c", std::path::Path::new("/var/lib/tenancy"));
        c.tier("internal").mig_profiles(["1g.18gb"]);
        c.tenant("acme")
            .tier("internal")
            .groups(["acme"])
            .egress(["10.20.0.0/16:443/tcp"]);
        c.to_string()
    }

    /// The cache is only trusted from root's own folder and files.
    fn root() -> bool {
        requires_root("the cache is root's only")
    }

    fn world() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("tenancy.toml");
        fs::write(&path, toml()).unwrap();
        let dir = tmp.path().join("cache");
        (tmp, path, dir)
    }

    fn shown(c: &Config) -> String {
        format!("{c:?}")
    }

    #[test]
    fn the_second_load_comes_from_the_cache_and_equals_the_parse() {
        if !root() {
            return;
        }
        let (_tmp, path, dir) = world();
        let (first, hit) = load_via(&path, &dir).unwrap();
        assert!(!hit);
        let mode = fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "cache folder mode {mode:o}");
        let (second, hit) = load_via(&path, &dir).unwrap();
        assert!(hit);
        assert_eq!(shown(&first), shown(&second));
        assert_eq!(shown(&second), shown(&Config::from_file(&path).unwrap()));
        assert_eq!(
            second.tenants["acme"].egress[0].to_string(),
            "10.20.0.0/16:443/tcp"
        );
    }

    #[test]
    fn a_changed_config_is_parsed_again_and_an_invalid_one_fails() {
        if !root() {
            return;
        }
        let (_tmp, path, dir) = world();
        load_via(&path, &dir).unwrap();
        // Same length, same second: only the text tells.
        fs::write(&path, toml().replace("acme", "acne")).unwrap();
        let (c, hit) = load_via(&path, &dir).unwrap();
        assert!(!hit);
        assert!(c.tenants.contains_key("acne") && !c.tenants.contains_key("acme"));
        assert!(load_via(&path, &dir).unwrap().1);
        fs::write(
            &path,
            toml().replace("tier = \"internal\"", "tier = \"nope\""),
        )
        .unwrap();
        assert!(
            load_via(&path, &dir).is_err(),
            "an invalid config was served"
        );
    }

    #[test]
    fn a_cache_that_is_not_roots_own_or_does_not_match_is_not_used() {
        if !root() {
            return;
        }
        let (_tmp, path, dir) = world();
        load_via(&path, &dir).unwrap();
        let file = dir.join(file_name(&path));
        // Another key (another text, or a build with other types): not used, rewritten.
        let mut entry: serde_json::Value =
            serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        entry["key"] = "0".repeat(64).into();
        fs::write(&file, serde_json::to_vec(&entry).unwrap()).unwrap();
        assert!(!load_via(&path, &dir).unwrap().1);
        assert!(load_via(&path, &dir).unwrap().1);
        // Writable by others, owned by another user, garbage: not used.
        fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!load_via(&path, &dir).unwrap().1);
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load_via(&path, &dir).unwrap().1);
        rustix::fs::chown(&file, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
        assert!(!load_via(&path, &dir).unwrap().1);
        fs::write(&file, b"{not json").unwrap();
        assert!(!load_via(&path, &dir).unwrap().1);
        // A folder others may write: neither read nor written.
        fs::remove_file(&file).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!load_via(&path, &dir).unwrap().1);
        assert!(!file.exists(), "written into a folder others may write");
        // A symlink in the cache's place is not followed, even to a matching entry.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        load_via(&path, &dir).unwrap();
        let elsewhere = dir.join("elsewhere.json");
        fs::rename(&file, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &file).unwrap();
        assert!(!load_via(&path, &dir).unwrap().1);
        assert!(!file.is_symlink(), "the link was not replaced");
        assert!(load_via(&path, &dir).unwrap().1);
    }

    #[test]
    fn entries_of_configs_that_are_gone_are_removed_when_one_is_written() {
        if !root() {
            return;
        }
        let (_tmp, path, dir) = world();
        let (gone_tmp, gone_path, _) = world();
        let (_kept_tmp, kept_path, _) = world();
        load_via(&gone_path, &dir).unwrap();
        load_via(&kept_path, &dir).unwrap();
        let names = || {
            let mut v: Vec<String> = fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names().len(), 2);
        drop(gone_tmp);
        // A hit writes nothing and removes nothing.
        assert!(load_via(&kept_path, &dir).unwrap().1);
        assert_eq!(names().len(), 2);
        // A miss writes an entry and removes the one whose config is gone.
        load_via(&path, &dir).unwrap();
        let mut want = vec![file_name(&kept_path), file_name(&path)];
        want.sort();
        assert_eq!(names(), want);
    }
}
