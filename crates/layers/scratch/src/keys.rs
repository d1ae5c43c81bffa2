//! The keys of retained encrypted folders, wrapped by the node key, in the state folder.
//!
//! A retain tier's job key must outlive the kernel's keyring (a reboot, the key removed at job
//! end) for `retain_days`, so that `tenancyctl scratch unlock` can add it again. It is kept
//! sealed with XChaCha20-Poly1305 under the node key (`<state_dir>/scratch-node.key`, 32 random
//! bytes, root's alone, made on first use), one file per key:
//! `<state_dir>/scratch-keys/<key id>.key`, a JSON object naming the tenant and job the key is
//! bound to (they are the AEAD's associated data, with the key id). Destroying that file at
//! expiry (overwritten, then unlinked) is destroying the folder's last key.

use crate::fscrypt::{fill_random, from_hex, to_hex, JobKey, KeyId, KEY_SIZE};
use crate::{Result, ScratchError};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The node key's file in the state folder.
pub const NODE_KEY_FILE: &str = "scratch-node.key";
/// The folder of wrapped keys in the state folder.
pub const KEYS_DIR: &str = "scratch-keys";
const NODE_KEY_SIZE: usize = 32;
const FORMAT: u32 = 1;

/// A retained key as stored: sealed under the node key, bound to its tenant and job.
#[derive(Serialize, Deserialize)]
struct Wrapped {
    version: u32,
    key_id: KeyId,
    tenant: String,
    job_id: u64,
    nonce: String,
    sealed: String,
}

/// Whose key a wrapped key is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub tenant: String,
    pub job_id: u64,
}

/// The wrapped keys of a node (in its state folder).
#[derive(Debug, Clone)]
pub struct KeyStore {
    state_dir: PathBuf,
}

fn key_err(msg: impl Into<String>) -> ScratchError {
    ScratchError::Key { msg: msg.into() }
}

fn aad(id: KeyId, tenant: &str, job_id: u64) -> Vec<u8> {
    let mut a = b"slurm-tenancy scratch key v1\0".to_vec();
    a.extend(id.0);
    a.extend(tenant.as_bytes());
    a.push(0);
    a.extend(job_id.to_le_bytes());
    a
}

/// Writes `bytes` to a new file `path` (root's alone, mode `mode`), durably: a temporary file
/// synced, renamed into place without replacing anything, and the folder synced.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().expect("a file in a folder");
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    drop(f);
    let placed = written.and_then(|()| {
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &tmp,
            rustix::fs::CWD,
            path,
            rustix::fs::RenameFlags::NOREPLACE,
        )
        .map_err(std::io::Error::from)
    });
    if placed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    placed?;
    std::fs::File::open(dir)?.sync_all()
}

/// Reads a file that must be root's alone (a regular file, owner root, nothing for others).
fn read_root_only(path: &Path, max: u64) -> std::io::Result<Zeroizing<Vec<u8>>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() || m.uid() != 0 || m.mode() & 0o077 != 0 || m.len() > max {
        return Err(std::io::Error::other(format!(
            "{} is not root's alone (uid {}, mode {:04o}, {} bytes)",
            path.display(),
            m.uid(),
            m.mode() & 0o7777,
            m.len()
        )));
    }
    let mut buf = Zeroizing::new(Vec::with_capacity(m.len() as usize));
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

impl KeyStore {
    pub fn new(state_dir: &Path) -> KeyStore {
        KeyStore {
            state_dir: state_dir.to_path_buf(),
        }
    }

    /// The folder of wrapped keys.
    pub fn dir(&self) -> PathBuf {
        self.state_dir.join(KEYS_DIR)
    }

    /// The node key's file.
    pub fn node_key_path(&self) -> PathBuf {
        self.state_dir.join(NODE_KEY_FILE)
    }

    /// Where the wrapped key `id` is kept.
    pub fn path_of(&self, id: KeyId) -> PathBuf {
        self.dir().join(format!("{id}.key"))
    }

    /// The node key; made (32 bytes from the kernel's CSPRNG, mode 0400) when `make` and
    /// there is none yet.
    fn node_key(&self, make: bool) -> Result<Zeroizing<[u8; NODE_KEY_SIZE]>> {
        let path = self.node_key_path();
        let read = |path: &Path| -> Result<Zeroizing<[u8; NODE_KEY_SIZE]>> {
            let bytes = read_root_only(path, NODE_KEY_SIZE as u64)
                .map_err(|e| key_err(format!("node key {}: {e}", path.display())))?;
            let mut key = Zeroizing::new([0u8; NODE_KEY_SIZE]);
            if bytes.len() != NODE_KEY_SIZE {
                return Err(key_err(format!(
                    "node key {} holds {} bytes, not {NODE_KEY_SIZE}; restore it from its \
                     backup (without it the retained encrypted folders cannot be unlocked)",
                    path.display(),
                    bytes.len()
                )));
            }
            key.copy_from_slice(&bytes);
            Ok(key)
        };
        match std::fs::symlink_metadata(&path) {
            Ok(_) => read(&path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && make => {
                let mut key = Zeroizing::new([0u8; NODE_KEY_SIZE]);
                fill_random(&mut key[..]).map_err(|e| key_err(format!("getrandom: {e}")))?;
                match write_new(&path, &key[..], 0o400) {
                    Ok(()) => Ok(key),
                    // Made meanwhile by another process: that one is the node's.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(&path),
                    Err(e) => Err(key_err(format!(
                        "cannot make the node key {}: {e}",
                        path.display()
                    ))),
                }
            }
            Err(e) => Err(key_err(format!("node key {}: {e}", path.display()))),
        }
    }

    /// Seals `key` for `tenant`'s job `job_id` and writes it durably; the node key is made if
    /// there is none. Returns the file.
    pub fn store(&self, key: &JobKey, tenant: &str, job_id: u64) -> Result<PathBuf> {
        let dir = self.dir();
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .map_err(|e| key_err(format!("chmod {}: {e}", dir.display())))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(key_err(format!("mkdir {}: {e}", dir.display()))),
        }
        let m = std::fs::symlink_metadata(&dir)
            .map_err(|e| key_err(format!("{}: {e}", dir.display())))?;
        if !m.is_dir() || m.uid() != 0 || m.mode() & 0o077 != 0 {
            return Err(key_err(format!(
                "{d} is not a folder of root's alone (uid {}, mode {:04o}); fix it: chown root \
                 {d} && chmod 700 {d}",
                m.uid(),
                m.mode() & 0o7777,
                d = dir.display(),
            )));
        }
        let node = self.node_key(true)?;
        let mut nonce = [0u8; 24];
        fill_random(&mut nonce).map_err(|e| key_err(format!("getrandom: {e}")))?;
        let id = key.id();
        let sealed = XChaCha20Poly1305::new((&*node).into())
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: key.raw(),
                    aad: &aad(id, tenant, job_id),
                },
            )
            .map_err(|_| key_err("sealing the job key failed"))?;
        let record = Wrapped {
            version: FORMAT,
            key_id: id,
            tenant: tenant.to_string(),
            job_id,
            nonce: to_hex(&nonce),
            sealed: to_hex(&sealed),
        };
        let path = self.path_of(id);
        let text = serde_json::to_vec(&record).expect("a wrapped key serializes");
        write_new(&path, &text, 0o400)
            .map_err(|e| key_err(format!("cannot write {}: {e}", path.display())))?;
        Ok(path)
    }

    /// The key `id` unsealed, and whose it is; an error when it is missing, damaged, or bound
    /// to other names than its file says.
    pub fn load(&self, id: KeyId) -> Result<(JobKey, Owner)> {
        let path = self.path_of(id);
        let text = read_root_only(&path, 4096).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => key_err(format!(
                "no wrapped key {} (destroyed at expiry, or never kept: the tier did not \
                 retain its scratch)",
                path.display()
            )),
            _ => key_err(format!("{}: {e}", path.display())),
        })?;
        let w: Wrapped = serde_json::from_slice(&text)
            .map_err(|e| key_err(format!("{}: not a wrapped key: {e}", path.display())))?;
        if w.version != FORMAT || w.key_id != id {
            return Err(key_err(format!(
                "{}: format {} for key {}, expected format {FORMAT} for key {id}",
                path.display(),
                w.version,
                w.key_id
            )));
        }
        let (Some(nonce), Some(sealed)) = (from_hex(&w.nonce), from_hex(&w.sealed)) else {
            return Err(key_err(format!("{}: damaged", path.display())));
        };
        if nonce.len() != 24 {
            return Err(key_err(format!("{}: damaged nonce", path.display())));
        }
        let node = self.node_key(false)?;
        let raw = Zeroizing::new(
            XChaCha20Poly1305::new((&*node).into())
                .decrypt(
                    XNonce::from_slice(&nonce),
                    Payload {
                        msg: &sealed,
                        aad: &aad(id, &w.tenant, w.job_id),
                    },
                )
                .map_err(|_| {
                    key_err(format!(
                        "{} does not open with the node key {} (another node's key, or \
                         damaged)",
                        path.display(),
                        self.node_key_path().display()
                    ))
                })?,
        );
        let mut bytes = Zeroizing::new([0u8; KEY_SIZE]);
        if raw.len() != KEY_SIZE {
            return Err(key_err(format!(
                "{}: not a {KEY_SIZE}-byte key",
                path.display()
            )));
        }
        bytes.copy_from_slice(&raw);
        let key = JobKey::from_raw(bytes);
        if key.id() != id {
            return Err(key_err(format!(
                "{}: the key it holds is not key {id}",
                path.display()
            )));
        }
        Ok((
            key,
            Owner {
                tenant: w.tenant,
                job_id: w.job_id,
            },
        ))
    }

    /// Destroys the wrapped key `id`: its bytes overwritten (synced), then the file unlinked
    /// and the folder synced. `false` when there was none.
    pub fn destroy(&self, id: KeyId) -> Result<bool> {
        let path = self.path_of(id);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path);
        let mut f = match f {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(key_err(format!("{}: {e}", path.display()))),
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let overwritten = f
            .write_all(&vec![0u8; len as usize])
            .and_then(|()| f.sync_all());
        drop(f);
        overwritten.map_err(|e| key_err(format!("overwrite {}: {e}", path.display())))?;
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(key_err(format!("unlink {}: {e}", path.display()))),
        }
        if let Ok(d) = std::fs::File::open(self.dir()) {
            let _ = d.sync_all();
        }
        Ok(true)
    }

    /// The ids of every wrapped key kept (files named `<32 hex>.key`).
    pub fn ids(&self) -> Result<Vec<KeyId>> {
        let rd = match std::fs::read_dir(self.dir()) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(key_err(format!("{}: {e}", self.dir().display()))),
        };
        let mut ids: Vec<KeyId> = rd
            .flatten()
            .filter_map(|e| {
                let n = e.file_name();
                n.to_str()?.strip_suffix(".key")?.parse().ok()
            })
            .collect();
        ids.sort();
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key sealed for a job opens again with the same node key, as the same key; bound to
    /// its tenant and job (a changed name fails); gone once destroyed.
    #[test]
    fn a_wrapped_key_opens_only_as_itself() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIP (needs root: root-owned key files)");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let store = KeyStore::new(t.path());
        let key = JobKey::generate().unwrap();
        let path = store.store(&key, "acme", 7).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&to_hex(key.raw())), "the key is in clear");
        let m = std::fs::metadata(store.node_key_path()).unwrap();
        assert_eq!(m.mode() & 0o777, 0o400);
        let (back, owner) = store.load(key.id()).unwrap();
        assert_eq!(back.raw(), key.raw());
        assert_eq!(
            owner,
            Owner {
                tenant: "acme".into(),
                job_id: 7
            }
        );
        assert_eq!(store.ids().unwrap(), vec![key.id()]);
        // Bound to its names: another tenant written in fails to open.
        let forged = text.replace("\"acme\"", "\"evil\"");
        std::fs::remove_file(&path).unwrap();
        write_new(&path, forged.as_bytes(), 0o400).unwrap();
        assert!(store.load(key.id()).is_err());
        assert!(store.destroy(key.id()).unwrap());
        assert!(!path.exists());
        assert!(!store.destroy(key.id()).unwrap());
        assert!(store.load(key.id()).is_err());
    }
}
