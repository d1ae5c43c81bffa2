//! Per-node Ed25519 keys that sign anchors (NIST SP 800-53 AU-9(3), AU-10): each node holds
//! its own private key, root's alone, and an auditor checks anchors with the nodes' public keys
//! and no secret. A node's key signs the node's name with each anchor, and verify takes a
//! signature only from a key listed for the node the anchor names, so root on one node cannot
//! sign for another (which the cluster-wide HMAC key of `cluster.audit_anchor_key` allowed).

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha256};

/// First word of a node key file: `tenancy-audit-ed25519-v1 <64 hex of the private seed>`.
pub const KEY_FILE_MAGIC: &str = "tenancy-audit-ed25519-v1";
/// The algorithm word of a public key line: `<node> ed25519 <64 hex>`.
pub const ALGORITHM: &str = "ed25519";

/// Reads a secret file: a regular file (not followed through a symlink) that only its owner,
/// root or the reader, may read or write, of `min` to `max` bytes. Errors name the file (as
/// `what PATH`) and what to do.
pub fn read_root_only(path: &Path, what: &str, min: usize, max: usize) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let why = |w: String| format!("{what} {}: {w}", path.display());
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32)
        .open(path)
        .map_err(|e| why(format!("cannot open: {e}")))?;
    let m = f.metadata().map_err(|e| why(e.to_string()))?;
    let me = rustix::process::geteuid().as_raw();
    if !m.is_file() {
        return Err(why("not a regular file".into()));
    }
    if m.uid() != 0 && m.uid() != me {
        return Err(why(format!(
            "owned by uid {}, not root; chown root:root {}",
            m.uid(),
            path.display()
        )));
    }
    if m.mode() & 0o077 != 0 {
        return Err(why(format!(
            "mode {:04o} lets others read or write it; chmod 600",
            m.mode() & 0o7777
        )));
    }
    let mut bytes = Vec::with_capacity(128);
    Read::by_ref(&mut f)
        .take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| why(format!("cannot read: {e}")))?;
    if bytes.len() < min || bytes.len() > max {
        return Err(why(format!("holds {} bytes", bytes.len())));
    }
    Ok(bytes)
}

/// The short name of a public key that anchors carry (`key=`): the first 16 hex digits of the
/// SHA-256 of its 32 bytes.
pub fn key_id(public: &VerifyingKey) -> String {
    hex::encode(&Sha256::digest(public.as_bytes())[..8])
}

/// This node's signing key.
pub struct NodeKey {
    signing: SigningKey,
    id: String,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeKey({})", self.id)
    }
}

impl NodeKey {
    /// A key from its 32-byte seed (tests, and [`NodeKey::generate`]).
    pub fn from_seed(seed: &[u8; 32]) -> NodeKey {
        let signing = SigningKey::from_bytes(seed);
        let id = key_id(&signing.verifying_key());
        NodeKey { signing, id }
    }

    /// A new key from the kernel's random numbers (getrandom).
    pub fn generate() -> std::io::Result<NodeKey> {
        let mut seed = [0u8; 32];
        let mut filled = 0;
        while filled < seed.len() {
            filled += rustix::rand::getrandom(
                &mut seed[filled..],
                rustix::rand::GetRandomFlags::empty(),
            )?;
        }
        Ok(NodeKey::from_seed(&seed))
    }

    /// Reads a key file [`NodeKey::write_new`] made (root's alone, mode 0600).
    pub fn load(path: &Path) -> Result<NodeKey, String> {
        let bytes = read_root_only(path, "audit signing key", 10, 512)?;
        let bad = || {
            format!(
                "audit signing key {}: not a key file of `tenancyctl audit keygen` (want one \
                 line `{KEY_FILE_MAGIC} <64 hex digits>`)",
                path.display()
            )
        };
        let text = std::str::from_utf8(&bytes).map_err(|_| bad())?;
        let mut words = text.split_whitespace();
        if words.next() != Some(KEY_FILE_MAGIC) {
            return Err(bad());
        }
        let mut seed = [0u8; 32];
        hex::decode_to_slice(words.next().ok_or_else(bad)?, &mut seed).map_err(|_| bad())?;
        Ok(NodeKey::from_seed(&seed))
    }

    /// Writes this key to a new file at `path` (mode 0600, fsync'd with its folder); an
    /// existing file is never overwritten.
    pub fn write_new(&self, path: &Path) -> Result<(), String> {
        let why = |e: std::io::Error| format!("audit signing key {}: {e}", path.display());
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(
                (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32,
            )
            .open(path)
            .map_err(why)?;
        let line = format!(
            "{KEY_FILE_MAGIC} {}\n",
            hex::encode(self.signing.to_bytes())
        );
        f.write_all(line.as_bytes()).map_err(why)?;
        f.sync_all().map_err(why)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(why)?;
        }
        Ok(())
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn public(&self) -> VerifyingKey {
        self.signing.verifying_key()
    }

    /// The line of the public keys file for this key: `<node> ed25519 <64 hex>`.
    pub fn public_line(&self, node: &str) -> String {
        format!(
            "{node} {ALGORITHM} {}",
            hex::encode(self.public().as_bytes())
        )
    }

    /// The signature of `text`, 128 lowercase hex digits.
    pub fn sign(&self, text: &str) -> String {
        hex::encode(self.signing.sign(text.as_bytes()).to_bytes())
    }
}

/// What a signature check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SigCheck {
    /// Signed by a key listed for the anchor's node.
    Valid,
    /// Signed by a key listed for another node: that node's root signing for this one.
    OtherNodesKey(String),
    /// The key id is in no line of the file.
    UnknownKey,
    /// The key is the node's but the signature does not hold (edited anchor).
    Invalid,
}

/// The nodes' public keys (`audit verify --public-keys FILE`): one line per node and key,
/// `<node> ed25519 <64 hex>`; `#` comments and blank lines skipped. A node whose key was
/// rotated keeps a line for each of its keys, so its older anchors still verify.
#[derive(Debug, Clone, Default)]
pub struct PublicKeys {
    /// key id -> (node, key).
    by_id: HashMap<String, (String, VerifyingKey)>,
}

impl PublicKeys {
    pub fn load(path: &Path) -> Result<PublicKeys, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("public keys {}: cannot read: {e}", path.display()))?;
        PublicKeys::parse(&text, &path.display().to_string())
    }

    /// Parses the file's text; errors name `source:line`.
    pub fn parse(text: &str, source: &str) -> Result<PublicKeys, String> {
        let mut keys = PublicKeys::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |what: &str| {
                format!(
                    "{source}:{}: {what}; want `<node> {ALGORITHM} <64 hex digits>` as \
                     `tenancyctl audit keygen` prints it",
                    i + 1
                )
            };
            let w: Vec<&str> = line.split_whitespace().collect();
            let [node, alg, hexkey] = w[..] else {
                return Err(bad("not three words"));
            };
            if alg != ALGORITHM {
                return Err(bad(&format!("unknown algorithm {alg:?}")));
            }
            let mut b = [0u8; 32];
            hex::decode_to_slice(hexkey, &mut b)
                .map_err(|_| bad("the key is not 64 hex digits"))?;
            let key = VerifyingKey::from_bytes(&b).map_err(|_| bad("not an Ed25519 public key"))?;
            let id = key_id(&key);
            if let Some((other, _)) = keys.by_id.get(&id) {
                if other != node {
                    return Err(bad(&format!(
                        "the same key is listed for node {other}: each node has a key of its own"
                    )));
                }
            }
            keys.by_id.insert(id, (node.to_string(), key));
        }
        Ok(keys)
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Checks `sig_hex` over `text`, which names `node`, made with the key `key_id`.
    pub fn check(&self, node: &str, key_id: &str, text: &str, sig_hex: &str) -> SigCheck {
        let Some((owner, key)) = self.by_id.get(key_id) else {
            return SigCheck::UnknownKey;
        };
        let mut sig = [0u8; 64];
        let holds = hex::decode_to_slice(sig_hex, &mut sig).is_ok()
            && key
                .verify(text.as_bytes(), &ed25519_dalek::Signature::from_bytes(&sig))
                .is_ok();
        match (holds, owner == node) {
            (true, true) => SigCheck::Valid,
            (true, false) => SigCheck::OtherNodesKey(owner.clone()),
            (false, _) => SigCheck::Invalid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_round_trips_and_is_roots_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("node.key");
        let k = NodeKey::generate().unwrap();
        k.write_new(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let back = NodeKey::load(&p).unwrap();
        assert_eq!(back.id(), k.id());
        assert!(
            k.write_new(&p).is_err(),
            "an existing key is never overwritten"
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = NodeKey::load(&p).unwrap_err();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        let keys = PublicKeys::parse(&format!("{}\n# x\n", k.public_line("n1")), "f").unwrap();
        let sig = k.sign("node=n1 x");
        assert_eq!(keys.check("n1", k.id(), "node=n1 x", &sig), SigCheck::Valid);
        assert_eq!(
            keys.check("n1", k.id(), "node=n1 y", &sig),
            SigCheck::Invalid
        );
        assert_eq!(
            keys.check("n2", k.id(), "node=n1 x", &sig),
            SigCheck::OtherNodesKey("n1".into())
        );
        assert!(PublicKeys::parse("n1 rsa abc", "f")
            .unwrap_err()
            .contains("f:1"));
    }
}
