//! fscrypt v2: a job folder encrypted with a key of its own, held in the file system's keyring
//! (docs/encrypted-scratch.md).
//!
//! The kernel's interface (Documentation/filesystems/fscrypt.rst): `FS_IOC_SET_ENCRYPTION_POLICY`
//! on an empty folder (a v2 policy names its key by a 16-byte identifier), and the key itself
//! added to, and removed from, the file system's keyring with `FS_IOC_ADD_ENCRYPTION_KEY` and
//! `FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS` on any file of it. Once removed, the folder's names
//! read as ciphertext and opening a file fails with ENOKEY, for root too: removing the key is
//! the erase. The structures and ioctl numbers are linux-raw-sys's (the UAPI headers); the
//! calls go through rustix.
//!
//! A key's identifier is HKDF-SHA512 of the key (what the kernel computes when it is added), so
//! the prolog knows it, and journals it, before the key exists anywhere but in its memory.

use rustix::fs::StatFs;
use rustix::io::Errno;
use rustix::ioctl::{ioctl, Opcode, Updater};
use std::fmt;
use std::os::fd::AsFd;
use std::path::Path;
use zeroize::{Zeroize, Zeroizing};

use linux_raw_sys::general as k;
use linux_raw_sys::ioctl as nr;

/// Size of a job key: the most fscrypt takes (AES-256-XTS needs 64 bytes of key).
pub const KEY_SIZE: usize = k::FSCRYPT_MAX_KEY_SIZE as usize;

/// The identifier of a key (`master_key_identifier` of a v2 policy), written in hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 16]);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&to_hex(&self.0))
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of an even-length hex string; `None` for anything else.
pub(crate) fn from_hex(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.len() & 1 == 1 || !b.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    b.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

impl std::str::FromStr for KeyId {
    type Err = String;
    fn from_str(s: &str) -> Result<KeyId, String> {
        from_hex(s)
            .and_then(|v| <[u8; 16]>::try_from(v).ok())
            .map(KeyId)
            .ok_or_else(|| format!("key identifier {s:?} is not 32 hexadecimal digits"))
    }
}

impl serde::Serialize for KeyId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for KeyId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<KeyId, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A job's key: random from the kernel's CSPRNG, in this process's memory only (wiped when
/// dropped), given to the kernel once. It is never written anywhere in clear.
pub struct JobKey {
    raw: Zeroizing<[u8; KEY_SIZE]>,
    id: KeyId,
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobKey({})", self.id)
    }
}

impl JobKey {
    /// A fresh key from `getrandom(2)` (blocks only before the CSPRNG is seeded at boot).
    pub fn generate() -> std::io::Result<JobKey> {
        let mut raw = Zeroizing::new([0u8; KEY_SIZE]);
        fill_random(&mut raw[..])?;
        Ok(JobKey::from_raw(raw))
    }

    /// A key from its bytes (an unwrapped retained key).
    pub fn from_raw(raw: Zeroizing<[u8; KEY_SIZE]>) -> JobKey {
        let id = identifier(&raw);
        JobKey { raw, id }
    }

    pub fn id(&self) -> KeyId {
        self.id
    }

    pub(crate) fn raw(&self) -> &[u8; KEY_SIZE] {
        &self.raw
    }
}

/// Fills `buf` from the kernel's CSPRNG.
pub(crate) fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::rand::getrandom(&mut buf[done..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => done += n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// What the kernel computes as a v2 key's identifier (fs/crypto/keyring.c): HKDF-SHA512 with
/// no salt over the key, info `"fscrypt\0"` and the context byte of key identifiers (1).
fn identifier(raw: &[u8; KEY_SIZE]) -> KeyId {
    const HKDF_CONTEXT_KEY_IDENTIFIER: u8 = 1;
    let mut info = *b"fscrypt\0\0";
    info[8] = HKDF_CONTEXT_KEY_IDENTIFIER;
    let hk = hkdf::Hkdf::<sha2::Sha512>::new(None, raw);
    let mut id = [0u8; 16];
    hk.expand(&info, &mut id)
        .expect("16 bytes is a valid HKDF-SHA512 length");
    KeyId(id)
}

/// The policy of every job folder: v2, AES-256-XTS for contents, AES-256-CTS for names,
/// names padded to 32 bytes (their length shows less), the key named by `id`.
fn policy(id: KeyId) -> k::fscrypt_policy_v2 {
    k::fscrypt_policy_v2 {
        version: k::FSCRYPT_POLICY_V2 as u8,
        contents_encryption_mode: k::FSCRYPT_MODE_AES_256_XTS as u8,
        filenames_encryption_mode: k::FSCRYPT_MODE_AES_256_CTS as u8,
        flags: k::FSCRYPT_POLICY_FLAGS_PAD_32 as u8,
        log2_data_unit_size: 0,
        __reserved: [0; 3],
        master_key_identifier: id.0,
    }
}

/// The policy, as records and doctor name it.
pub const POLICY_NAME: &str = "fscrypt v2, AES-256-XTS contents, AES-256-CTS names";

fn spec_of(id: KeyId) -> k::fscrypt_key_specifier {
    // SAFETY: a plain C structure (integers and a union of byte arrays): all zeros is valid.
    let mut spec: k::fscrypt_key_specifier = unsafe { std::mem::zeroed() };
    spec.type_ = k::FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER;
    spec.u.identifier = id.0;
    spec
}

/// Sets the job folder's policy. `dir` must be an empty folder; root may set it before the
/// key is added (CAP_FOWNER), so the folder names its key on disk from the start.
pub fn set_policy(dir: impl AsFd, id: KeyId) -> Result<(), Errno> {
    let mut p = policy(id);
    // SAFETY: FS_IOC_SET_ENCRYPTION_POLICY reads a policy (v1 or v2, told apart by `version`)
    // from the pointer; `p` is one, alive for the call.
    unsafe {
        ioctl(
            dir,
            Updater::<{ nr::FS_IOC_SET_ENCRYPTION_POLICY as Opcode }, _>::new(&mut p),
        )
    }
}

/// The v2 policy's key of the folder `dir`: `None` when it is not encrypted (or its file
/// system has no fscrypt); a v1 policy is reported as an error (EINVAL: this product never
/// makes one).
pub fn policy_of(dir: impl AsFd) -> Result<Option<KeyId>, Errno> {
    // SAFETY: zeros are a valid value of this plain C structure.
    let mut arg: k::fscrypt_get_policy_ex_arg = unsafe { std::mem::zeroed() };
    arg.policy_size = std::mem::size_of::<k::fscrypt_get_policy_ex_arg__bindgen_ty_1>() as u64;
    // SAFETY: the kernel writes at most `policy_size` bytes of policy into `arg`.
    let r = unsafe {
        ioctl(
            dir,
            Updater::<{ nr::FS_IOC_GET_ENCRYPTION_POLICY_EX as Opcode }, _>::new(&mut arg),
        )
    };
    match r {
        Ok(()) => {
            // SAFETY: every variant of the union is plain bytes.
            let v = unsafe { arg.policy.version };
            if u32::from(v) != k::FSCRYPT_POLICY_V2 {
                return Err(Errno::INVAL);
            }
            // SAFETY: as above; the kernel said it is a v2 policy.
            Ok(Some(KeyId(unsafe { arg.policy.v2.master_key_identifier })))
        }
        Err(Errno::NODATA) | Err(Errno::NOTTY) | Err(Errno::OPNOTSUPP) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `fscrypt_add_key_arg` followed by the key (the structure ends in a flexible array).
#[repr(C)]
struct AddKey {
    arg: k::fscrypt_add_key_arg,
    raw: [u8; KEY_SIZE],
}

/// Adds `key` to the keyring of the file system `fs` is on (as root: the key is root's claim);
/// returns the identifier the kernel computed, which must be the key's.
pub fn add_key(fs: impl AsFd, key: &JobKey) -> Result<KeyId, Errno> {
    // SAFETY: all zeros is a valid value of this plain C structure and its byte array.
    let mut a: Zeroizing<AddKey> = Zeroizing::new(unsafe { std::mem::zeroed() });
    a.arg.key_spec.type_ = k::FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER;
    a.arg.raw_size = KEY_SIZE as u32;
    a.raw.copy_from_slice(key.raw());
    // SAFETY: the kernel reads `raw_size` bytes after the header, which `AddKey` holds, and
    // writes the identifier into `key_spec`.
    let r = unsafe {
        ioctl(
            fs,
            Updater::<{ nr::FS_IOC_ADD_ENCRYPTION_KEY as Opcode }, _>::new(&mut *a),
        )
    };
    r?;
    // SAFETY: the kernel filled the identifier member of the union.
    Ok(KeyId(unsafe { a.arg.key_spec.u.identifier }))
}

impl Zeroize for AddKey {
    fn zeroize(&mut self) {
        self.raw.zeroize();
    }
}

/// What [`remove_key`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Removal {
    /// The key is gone; every file it opened is locked.
    Removed,
    /// The key's secret is gone (nothing more can be opened), but files still in use keep
    /// theirs until they are closed: the removal is completed by trying again then.
    FilesBusy,
    /// The file system held no such key (never added, removed before, or a restart).
    Absent,
}

/// Removes the key `id` from the file system `fs` is on, every user's claim of it.
pub fn remove_key(fs: impl AsFd, id: KeyId) -> Result<Removal, Errno> {
    // SAFETY: zeros are a valid value of this plain C structure.
    let mut arg: k::fscrypt_remove_key_arg = unsafe { std::mem::zeroed() };
    arg.key_spec = spec_of(id);
    // SAFETY: the kernel reads the specifier and writes the status flags.
    let r = unsafe {
        ioctl(
            fs,
            Updater::<{ nr::FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS as Opcode }, _>::new(&mut arg),
        )
    };
    match r {
        Ok(()) if arg.removal_status_flags & k::FSCRYPT_KEY_REMOVAL_STATUS_FLAG_FILES_BUSY != 0 => {
            Ok(Removal::FilesBusy)
        }
        Ok(()) => Ok(Removal::Removed),
        // No such key, or a file system that cannot hold one (nothing was ever added there).
        Err(Errno::NOKEY) | Err(Errno::NOTTY) | Err(Errno::OPNOTSUPP) => Ok(Removal::Absent),
        Err(e) => Err(e),
    }
}

/// Where a key stands in the file system's keyring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStatus {
    Absent,
    Present,
    /// Removed while files were in use (see [`Removal::FilesBusy`]).
    IncompletelyRemoved,
}

/// The status of the key `id` on the file system `fs` is on.
pub fn key_status(fs: impl AsFd, id: KeyId) -> Result<KeyStatus, Errno> {
    // SAFETY: zeros are a valid value of this plain C structure.
    let mut arg: k::fscrypt_get_key_status_arg = unsafe { std::mem::zeroed() };
    arg.key_spec = spec_of(id);
    // SAFETY: the kernel reads the specifier and writes the status.
    unsafe {
        ioctl(
            fs,
            Updater::<{ nr::FS_IOC_GET_ENCRYPTION_KEY_STATUS as Opcode }, _>::new(&mut arg),
        )
    }?;
    Ok(match arg.status {
        k::FSCRYPT_KEY_STATUS_PRESENT => KeyStatus::Present,
        k::FSCRYPT_KEY_STATUS_INCOMPLETELY_REMOVED => KeyStatus::IncompletelyRemoved,
        _ => KeyStatus::Absent,
    })
}

/// Whether job folders under `dir` (the scratch root, open) can be encrypted: `Err` says why
/// not, naming the file system of `path` and what to do. Decided by the kernel: the policy
/// ioctl on `dir` answers ENODATA (an unencrypted folder of a file system with fscrypt),
/// EOPNOTSUPP (fscrypt, but the feature is off) or ENOTTY (no fscrypt at all).
pub fn probe(dir: impl AsFd, path: &Path) -> Result<(), String> {
    let dir = dir.as_fd();
    let fs = describe_fs(dir, path);
    match policy_of_raw(dir) {
        Err(Errno::NODATA) => Ok(()),
        Ok(()) => Err(format!(
            "scratch_root {} is itself an encrypted folder ({fs}): job folders would take its \
             key instead of their own; use a scratch_root that is not encrypted",
            path.display()
        )),
        Err(Errno::OPNOTSUPP) if fs.starts_with("ext") => Err(format!(
            "scratch_root {} is on {fs} without the encrypt feature; enable it with \
             `tune2fs -O encrypt <device>` (or make the file system with `mkfs.ext4 -O \
             encrypt`), or set scratch_encryption = \"off\" for the tier",
            path.display()
        )),
        Err(Errno::OPNOTSUPP) => Err(format!(
            "scratch_root {} is on {fs}, whose fscrypt support is off (f2fs: `mkfs.f2fs -O \
             encrypt`); enable it, or set scratch_encryption = \"off\" for the tier",
            path.display()
        )),
        Err(Errno::NOTTY) | Err(Errno::NOSYS) => Err(format!(
            "scratch_root {} is on {fs}, which has no per-folder encryption (fscrypt); put \
             scratch_root on a local ext4 made with `mkfs.ext4 -O encrypt` (or f2fs), or set \
             scratch_encryption = \"off\" for the tier",
            path.display()
        )),
        Err(e) => Err(format!(
            "scratch_root {} ({fs}): cannot ask the kernel whether it can be encrypted: {e}",
            path.display()
        )),
    }
}

fn policy_of_raw(dir: impl AsFd) -> Result<(), Errno> {
    // SAFETY: zeros are a valid value of this plain C structure.
    let mut arg: k::fscrypt_get_policy_ex_arg = unsafe { std::mem::zeroed() };
    arg.policy_size = std::mem::size_of::<k::fscrypt_get_policy_ex_arg__bindgen_ty_1>() as u64;
    // SAFETY: the kernel writes at most `policy_size` bytes of policy into `arg`.
    unsafe {
        ioctl(
            dir,
            Updater::<{ nr::FS_IOC_GET_ENCRYPTION_POLICY_EX as Opcode }, _>::new(&mut arg),
        )
    }
}

/// "ext4 (/dev/loop3 mounted at /scratch)": the file system type from mountinfo (the mount of
/// `dir`'s device holding `path`), else from the superblock's magic number.
pub fn describe_fs(dir: impl AsFd, path: &Path) -> String {
    let dir = dir.as_fd();
    let dev = rustix::fs::fstat(dir).map(|st| st.st_dev).ok();
    if let Some(m) = dev.and_then(|d| crate::mounts::mount_of(path, d)) {
        return format!(
            "{} ({} mounted at {})",
            m.fstype,
            m.source,
            m.mount_point.display()
        );
    }
    match rustix::fs::fstatfs(dir) {
        Ok(st) => magic_name(&st),
        Err(e) => format!("a file system that cannot be asked its type ({e})"),
    }
}

fn magic_name(st: &StatFs) -> String {
    let magic = st.f_type as u32;
    let name = match magic {
        k::EXT4_SUPER_MAGIC => "ext4",
        k::F2FS_SUPER_MAGIC => "f2fs",
        k::TMPFS_MAGIC => "tmpfs",
        k::NFS_SUPER_MAGIC => "nfs",
        k::OVERLAYFS_SUPER_MAGIC => "overlayfs",
        k::XFS_SUPER_MAGIC => "xfs",
        k::BTRFS_SUPER_MAGIC => "btrfs",
        _ => return format!("a file system of type {magic:#x}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_read_back_as_written() {
        let id = KeyId([0xab; 16]);
        assert_eq!(id.to_string(), "ab".repeat(16));
        assert_eq!(id.to_string().parse::<KeyId>().unwrap(), id);
        assert!("abc".parse::<KeyId>().is_err());
        assert!("zz".repeat(16).parse::<KeyId>().is_err());
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<KeyId>(&json).unwrap(), id);
    }

    /// Two keys differ, and so do their identifiers; the identifier is stable for a key.
    #[test]
    fn keys_are_fresh_and_named_by_their_hash() {
        let a = JobKey::generate().unwrap();
        let b = JobKey::generate().unwrap();
        assert_ne!(a.raw(), b.raw());
        assert_ne!(a.id(), b.id());
        let again = JobKey::from_raw(Zeroizing::new(*a.raw()));
        assert_eq!(again.id(), a.id());
        // Debug output names the key, never shows it.
        assert_eq!(format!("{a:?}"), format!("JobKey({})", a.id()));
    }
}
