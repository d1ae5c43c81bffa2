//! MIG profile tables per GPU model (8 memory slices, 7 compute slices).
//!
//! A *GI profile index* is the `NVML_GPU_INSTANCE_PROFILE_*` constant passed to
//! `nvmlDeviceGetGpuInstanceProfileInfoV`; the *GI profile id* is the `id` that call returns
//! (what `nvidia-smi mig -lgip` shows, and what create/placement calls take).

use serde::{Deserialize, Serialize};
use std::fmt;

/// GPU models whose MIG geometry this crate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum GpuModel {
    #[serde(rename = "A100-40GB")]
    A100_40GB,
    #[serde(rename = "A100-80GB")]
    A100_80GB,
    #[serde(rename = "H100-80GB")]
    H100_80GB,
    #[serde(rename = "H200-141GB")]
    H200_141GB,
}

impl GpuModel {
    pub const ALL: [GpuModel; 4] = [
        GpuModel::A100_40GB,
        GpuModel::A100_80GB,
        GpuModel::H100_80GB,
        GpuModel::H200_141GB,
    ];

    /// Canonical name as used in plans ("H200-141GB").
    pub fn as_str(self) -> &'static str {
        match self {
            GpuModel::A100_40GB => "A100-40GB",
            GpuModel::A100_80GB => "A100-80GB",
            GpuModel::H100_80GB => "H100-80GB",
            GpuModel::H200_141GB => "H200-141GB",
        }
    }

    /// Parse a canonical model name (case-insensitive).
    pub fn parse(s: &str) -> Option<GpuModel> {
        GpuModel::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s.trim()))
    }

    /// Recognise the model from an NVML device name such as "NVIDIA A100-SXM4-40GB",
    /// "NVIDIA H100 80GB HBM3" or "NVIDIA H200". Parts with other geometries (H100 NVL 94GB,
    /// H100 96GB, A30, GH200...) return None: fail closed rather than guess a table.
    pub fn from_nvml_name(name: &str) -> Option<GpuModel> {
        let n = name.to_ascii_uppercase();
        if n.contains("GH200") || n.contains("A30") {
            return None;
        }
        if n.contains("H200") {
            return Some(GpuModel::H200_141GB);
        }
        if n.contains("H100") {
            if n.contains("94GB") || n.contains("96GB") || n.contains("NVL") {
                return None;
            }
            return Some(GpuModel::H100_80GB);
        }
        if n.contains("A100") {
            if n.contains("80GB") {
                return Some(GpuModel::A100_80GB);
            }
            return Some(GpuModel::A100_40GB);
        }
        // Canonical names are accepted too (fixtures, tests).
        GpuModel::parse(name)
    }

    /// The profile table of this model.
    pub fn profiles(self) -> &'static [MigProfile] {
        match self {
            GpuModel::A100_40GB => &A100_40GB,
            GpuModel::A100_80GB | GpuModel::H100_80GB => &GB80,
            GpuModel::H200_141GB => &H200,
        }
    }

    /// Look a profile up by name ("3g.71gb", case-insensitive; "MIG 3g.71gb" accepted).
    pub fn profile(self, name: &str) -> Option<&'static MigProfile> {
        let name = name.trim();
        let name = name.strip_prefix("MIG ").unwrap_or(name);
        self.profiles().iter().find(|p| {
            p.name.eq_ignore_ascii_case(name) || p.slurm_type().eq_ignore_ascii_case(name)
        })
    }

    /// Look a profile up by GI profile id (19 = 1g, 0 = 7g, ...).
    pub fn profile_by_gi_id(self, id: u32) -> Option<&'static MigProfile> {
        self.profiles().iter().find(|p| p.gi_profile_id == id)
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One MIG GPU-instance profile of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MigProfile {
    /// "1g.18gb", "1g.18gb+me", ...
    pub name: &'static str,
    /// NVML_GPU_INSTANCE_PROFILE_* constant (argument of GetGpuInstanceProfileInfo).
    pub gi_profile_index: u32,
    /// GI profile id (returned by GetGpuInstanceProfileInfo, taken by create/placements).
    pub gi_profile_id: u32,
    /// NVML_COMPUTE_INSTANCE_PROFILE_* constant of the full-size CI of this GI.
    pub ci_profile_index: u32,
    /// Compute slices (of 7): the accounting unit (GPU slice-hours).
    pub compute_slices: u32,
    /// Memory slices (of 8) one placement covers.
    pub memory_slices: u32,
    /// Allowed placement starts (memory-slice offsets).
    pub starts: &'static [u32],
    /// Most instances of this profile one GPU can hold.
    pub max_instances: u32,
}

impl MigProfile {
    /// The GRES `Type=` used in Slurm: the profile name with `+` replaced by `_`
    /// ("1g.18gb+me" -> "1g.18gb_me"); Slurm's GRES parser is only known to accept
    /// `[A-Za-z0-9._-]` in types.
    pub fn slurm_type(&self) -> String {
        self.name.replace('+', "_")
    }
}

// NVML_GPU_INSTANCE_PROFILE_* constants.
const GIP_1: u32 = 0;
const GIP_2: u32 = 1;
const GIP_3: u32 = 2;
const GIP_4: u32 = 3;
const GIP_7: u32 = 4;
const GIP_1_REV1: u32 = 7; // 1g+me
const GIP_1_REV2: u32 = 9; // 1g, double memory
                           // NVML_COMPUTE_INSTANCE_PROFILE_* constants.
const CIP_1: u32 = 0;
const CIP_2: u32 = 1;
const CIP_3: u32 = 2;
const CIP_4: u32 = 3;
const CIP_7: u32 = 4;

const S1: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const S2: &[u32] = &[0, 2, 4, 6];
const S2G: &[u32] = &[0, 2, 4];
const S3: &[u32] = &[0, 4];
const S0: &[u32] = &[0];

macro_rules! table {
    ($($name:literal, $idx:expr, $id:literal, $ci:expr, $cs:literal, $ms:literal, $starts:expr, $max:literal;)*) => {
        [$(MigProfile { name: $name, gi_profile_index: $idx, gi_profile_id: $id, ci_profile_index: $ci,
            compute_slices: $cs, memory_slices: $ms, starts: $starts, max_instances: $max }),*]
    };
}

static A100_40GB: [MigProfile; 7] = table! {
    "1g.5gb",     GIP_1,      19, CIP_1, 1, 1, S1, 7;
    "1g.5gb+me",  GIP_1_REV1, 20, CIP_1, 1, 1, S1, 1;
    "1g.10gb",    GIP_1_REV2, 15, CIP_1, 1, 2, S2, 4;
    "2g.10gb",    GIP_2,      14, CIP_2, 2, 2, S2G, 3;
    "3g.20gb",    GIP_3,       9, CIP_3, 3, 4, S3, 2;
    "4g.20gb",    GIP_4,       5, CIP_4, 4, 4, S0, 1;
    "7g.40gb",    GIP_7,       0, CIP_7, 7, 8, S0, 1;
};

static GB80: [MigProfile; 7] = table! {
    "1g.10gb",    GIP_1,      19, CIP_1, 1, 1, S1, 7;
    "1g.10gb+me", GIP_1_REV1, 20, CIP_1, 1, 1, S1, 1;
    "1g.20gb",    GIP_1_REV2, 15, CIP_1, 1, 2, S2, 4;
    "2g.20gb",    GIP_2,      14, CIP_2, 2, 2, S2G, 3;
    "3g.40gb",    GIP_3,       9, CIP_3, 3, 4, S3, 2;
    "4g.40gb",    GIP_4,       5, CIP_4, 4, 4, S0, 1;
    "7g.80gb",    GIP_7,       0, CIP_7, 7, 8, S0, 1;
};

static H200: [MigProfile; 7] = table! {
    "1g.18gb",    GIP_1,      19, CIP_1, 1, 1, S1, 7;
    "1g.18gb+me", GIP_1_REV1, 20, CIP_1, 1, 1, S1, 1;
    "1g.35gb",    GIP_1_REV2, 15, CIP_1, 1, 2, S2, 4;
    "2g.35gb",    GIP_2,      14, CIP_2, 2, 2, S2G, 3;
    "3g.71gb",    GIP_3,       9, CIP_3, 3, 4, S3, 2;
    "4g.71gb",    GIP_4,       5, CIP_4, 4, 4, S0, 1;
    "7g.141gb",   GIP_7,       0, CIP_7, 7, 8, S0, 1;
};

/// Do two memory-slice ranges overlap?
pub fn overlaps(a_start: u32, a_size: u32, b_start: u32, b_size: u32) -> bool {
    a_start < b_start + b_size && b_start < a_start + a_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids() {
        let h = GpuModel::H200_141GB;
        assert_eq!(h.profile("3g.71gb").unwrap().gi_profile_id, 9);
        assert_eq!(h.profile("MIG 1g.18gb+me").unwrap().gi_profile_id, 20);
        assert_eq!(h.profile("1g.18gb_me").unwrap().name, "1g.18gb+me");
        assert_eq!(h.profile_by_gi_id(0).unwrap().name, "7g.141gb");
        assert!(h.profile("1g.5gb").is_none());
        assert_eq!(
            GpuModel::A100_40GB
                .profile("1g.10gb")
                .unwrap()
                .memory_slices,
            2
        );
        assert_eq!(
            GpuModel::A100_80GB
                .profile("1g.10gb")
                .unwrap()
                .memory_slices,
            1
        );
        for m in GpuModel::ALL {
            for p in m.profiles() {
                assert!(
                    p.starts.iter().all(|s| s + p.memory_slices <= 8),
                    "{m} {}",
                    p.name
                );
                assert_eq!(m.profile(p.name).unwrap(), p);
            }
        }
    }

    #[test]
    fn model_from_nvml_names() {
        assert_eq!(
            GpuModel::from_nvml_name("NVIDIA H200"),
            Some(GpuModel::H200_141GB)
        );
        assert_eq!(
            GpuModel::from_nvml_name("NVIDIA A100-SXM4-40GB"),
            Some(GpuModel::A100_40GB)
        );
        assert_eq!(
            GpuModel::from_nvml_name("NVIDIA A100-SXM4-80GB"),
            Some(GpuModel::A100_80GB)
        );
        assert_eq!(
            GpuModel::from_nvml_name("NVIDIA H100 80GB HBM3"),
            Some(GpuModel::H100_80GB)
        );
        assert_eq!(GpuModel::from_nvml_name("NVIDIA H100 NVL"), None);
        assert_eq!(GpuModel::from_nvml_name("NVIDIA A30"), None);
        assert_eq!(GpuModel::from_nvml_name("Tesla T4"), None);
    }
}
