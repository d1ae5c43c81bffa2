//! POSIX ACL xattr (`system.posix_acl_access` / `system.posix_acl_default`) binary format:
//! a little-endian u32 version (2), then 8-byte entries `{u16 tag, u16 perm, u32 id}`.

pub const ACL_XATTR_VERSION: u32 = 2;
pub const ACL_USER_OBJ: u16 = 0x01;
pub const ACL_USER: u16 = 0x02;
pub const ACL_GROUP_OBJ: u16 = 0x04;
pub const ACL_GROUP: u16 = 0x08;
pub const ACL_MASK: u16 = 0x10;
pub const ACL_OTHER: u16 = 0x20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u8,
    pub id: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acl {
    pub entries: Vec<AclEntry>,
}

impl Acl {
    pub fn parse(buf: &[u8]) -> Result<Acl, String> {
        if buf.len() < 4 || buf.len() % 8 != 4 {
            return Err(format!("ACL xattr of {} bytes is not 4 + 8*n", buf.len()));
        }
        let version = u32::from_le_bytes(buf[0..4].try_into().unwrap());
        if version != ACL_XATTR_VERSION {
            return Err(format!("ACL xattr version {version}, expected 2"));
        }
        let entries = buf[4..]
            .chunks_exact(8)
            .map(|c| AclEntry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: (u16::from_le_bytes([c[2], c[3]]) & 7) as u8,
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        Ok(Acl { entries })
    }
    pub fn get(&self, tag: u16) -> Option<u8> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }
    /// Mask entry; all permission bits when there is none.
    pub fn mask(&self) -> u8 {
        self.get(ACL_MASK).unwrap_or(7)
    }
    pub fn named(&self, tag: u16) -> impl Iterator<Item = &AclEntry> {
        self.entries.iter().filter(move |e| e.tag == tag)
    }
}

pub fn perm_str(p: u8) -> String {
    let mut s = String::with_capacity(3);
    s.push(if p & 4 != 0 { 'r' } else { '-' });
    s.push(if p & 2 != 0 { 'w' } else { '-' });
    s.push(if p & 1 != 0 { 'x' } else { '-' });
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses_entries_and_rejects_garbage() {
        let mut b = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [
            (1u16, 7u16, u32::MAX),
            (8, 5, 5001),
            (16, 5, u32::MAX),
            (32, 0, u32::MAX),
        ] {
            b.extend(tag.to_le_bytes());
            b.extend(perm.to_le_bytes());
            b.extend(id.to_le_bytes());
        }
        let a = Acl::parse(&b).unwrap();
        assert_eq!(a.entries.len(), 4);
        assert_eq!(
            a.named(ACL_GROUP).next(),
            Some(&AclEntry {
                tag: ACL_GROUP,
                perm: 5,
                id: 5001
            })
        );
        assert_eq!(a.mask(), 5);
        assert!(Acl::parse(&b[..7]).is_err());
        let mut v1 = b.clone();
        v1[0] = 1;
        assert!(Acl::parse(&v1).is_err());
        assert_eq!(perm_str(5), "r-x");
    }
}
