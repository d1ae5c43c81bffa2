//! A device class in cgroup v1 syntax (`c 1:* rwm`): a tier's `device_classes` in the config,
//! and what the devices layer allows and denies.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A device class string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("devices layer: invalid device class {text:?}: {msg} (expected e.g. \"c 1:* rwm\")")]
pub struct BadClass {
    pub text: String,
    pub msg: String,
}

/// Device type of a rule or a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DevType {
    /// `c`
    Char,
    /// `b`
    Block,
}

impl DevType {
    /// The cgroup v1 letter.
    pub fn letter(self) -> char {
        match self {
            DevType::Char => 'c',
            DevType::Block => 'b',
        }
    }
}

/// Access bits (values of the kernel's BPF_DEVCG_ACC_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Access(pub u8);

impl Access {
    pub const MKNOD: Access = Access(1);
    pub const READ: Access = Access(2);
    pub const WRITE: Access = Access(4);
    pub const RW: Access = Access(6);
    pub const RWM: Access = Access(7);

    /// True when every bit of `req` is in `self`.
    pub fn covers(self, req: Access) -> bool {
        req.0 & !self.0 == 0
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 & 2 != 0 {
            f.write_str("r")?;
        }
        if self.0 & 4 != 0 {
            f.write_str("w")?;
        }
        if self.0 & 1 != 0 {
            f.write_str("m")?;
        }
        Ok(())
    }
}

/// A device class in cgroup v1 syntax: `c 1:* rwm`, `c 195:254 rw`, `b *:* r`.
/// `a` (all devices) is refused: this layer only widens NVIDIA access per class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceClass {
    pub dev_type: DevType,
    /// None = `*`.
    pub major: Option<u32>,
    /// None = `*`.
    pub minor: Option<u32>,
    pub access: Access,
}

impl DeviceClass {
    /// One specific character device.
    pub fn char(major: u32, minor: u32, access: Access) -> Self {
        DeviceClass {
            dev_type: DevType::Char,
            major: Some(major),
            minor: Some(minor),
            access,
        }
    }

    /// Whether the class matches the device and grants `access`.
    pub fn matches(&self, t: DevType, major: u32, minor: u32, access: Access) -> bool {
        self.dev_type == t
            && self.major.is_none_or_eq(major)
            && self.minor.is_none_or_eq(minor)
            && self.access.covers(access)
    }
}

trait NoneOrEq {
    fn is_none_or_eq(&self, v: u32) -> bool;
}
impl NoneOrEq for Option<u32> {
    fn is_none_or_eq(&self, v: u32) -> bool {
        match self {
            None => true,
            Some(x) => *x == v,
        }
    }
}

impl fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |v: Option<u32>| v.map_or("*".to_string(), |v| v.to_string());
        write!(
            f,
            "{} {}:{} {}",
            self.dev_type.letter(),
            n(self.major),
            n(self.minor),
            self.access
        )
    }
}

impl DeviceClass {
    /// Why this class may not be one of a tier's extra device classes (`device_classes`), if it
    /// may not: the config check and the prolog use the same rule.
    pub fn refusal_as_extra(&self) -> Option<String> {
        (self.dev_type == DevType::Char && self.major.is_none()).then(|| {
            format!(
                "extra device class `{self}` has a wildcard major and would open every NVIDIA \
                 device; name the major"
            )
        })
    }
}

impl FromStr for DeviceClass {
    type Err = BadClass;
    fn from_str(s: &str) -> Result<Self, BadClass> {
        let bad = |msg: &str| BadClass {
            text: s.to_string(),
            msg: msg.to_string(),
        };
        let mut it = s.split_ascii_whitespace();
        let (t, mm, acc) = match (it.next(), it.next(), it.next(), it.next()) {
            (Some(t), Some(mm), Some(acc), None) => (t, mm, acc),
            _ => return Err(bad("expected three fields: type major:minor access")),
        };
        let dev_type = match t {
            "c" => DevType::Char,
            "b" => DevType::Block,
            "a" => return Err(bad("`a` (all devices) is not allowed; name c or b classes")),
            _ => return Err(bad("type must be c or b")),
        };
        let (ma, mi) = mm.split_once(':').ok_or_else(|| bad("missing ':'"))?;
        let num = |x: &str, bits: u32, what: &str| -> Result<Option<u32>, BadClass> {
            if x == "*" {
                return Ok(None);
            }
            if x.is_empty() || !x.bytes().all(|b| b.is_ascii_digit()) || x.len() > 8 {
                return Err(bad(&format!("{what} must be a number or *")));
            }
            let v: u32 = x
                .parse()
                .map_err(|_| bad(&format!("{what} out of range")))?;
            if v >= 1 << bits {
                return Err(bad(&format!("{what} out of range")));
            }
            Ok(Some(v))
        };
        let major = num(ma, 12, "major")?;
        let minor = num(mi, 20, "minor")?;
        let mut a = 0u8;
        if acc.is_empty() {
            return Err(bad("empty access"));
        }
        for ch in acc.chars() {
            let bit = match ch {
                'r' => 2,
                'w' => 4,
                'm' => 1,
                _ => return Err(bad("access letters are r, w, m")),
            };
            if a & bit != 0 {
                return Err(bad("repeated access letter"));
            }
            a |= bit;
        }
        Ok(DeviceClass {
            dev_type,
            major,
            minor,
            access: Access(a),
        })
    }
}

impl Serialize for DeviceClass {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceClass {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
