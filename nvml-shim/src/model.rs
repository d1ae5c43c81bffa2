//! Static MIG geometry of the modelled GPUs: GPU instance (GI) profile tables, placements,
//! compute instance (CI) profiles derived from a GI, GI ids derived from placement (the
//! driver's "swizzle id"), and the numbering of /proc/driver/nvidia-caps/mig-minors.

use serde::{Deserialize, Serialize};

/// Number of memory slices on every modelled GPU.
pub const MEMORY_SLICES: u32 = 8;
/// Number of compute slices on every modelled GPU.
pub const COMPUTE_SLICES: u32 = 7;
/// NVML_GPU_INSTANCE_PROFILE_COUNT (nvml.h, r570+).
pub const GI_PROFILE_INDEX_COUNT: u32 = 0x11;
/// NVML_COMPUTE_INSTANCE_PROFILE_COUNT.
pub const CI_PROFILE_INDEX_COUNT: u32 = 0x8;
/// NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT.
pub const CI_ENGINE_PROFILE_COUNT: u32 = 0x1;
/// GI ids 0..=14 exist (one per possible memory span); CI ids 0..=7 per GI.
pub const MAX_GI_IDS: u32 = 15;
pub const MAX_CI_IDS: u32 = 8;
/// The driver's static mig-minors table covers this many GPUs.
pub const MIG_MINORS_GPUS: u32 = 32;
/// Minors per GPU in mig-minors: 15 GIs x (1 GI access + 8 CI access).
pub const MINORS_PER_GPU: u32 = MAX_GI_IDS * (1 + MAX_CI_IDS);
/// NVML caps the number of MIG devices per GPU at the compute slice count.
pub const MAX_MIG_DEVICES: u32 = COMPUTE_SLICES;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

/// One GPU instance profile row, as nvmlDeviceGetGpuInstanceProfileInfo reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiProfile {
    /// NVML_GPU_INSTANCE_PROFILE_* index used to query the profile.
    pub index: u32,
    /// Profile id (what create / placements / remaining capacity take).
    pub id: u32,
    /// Short name without the "MIG " prefix, e.g. "1g.5gb".
    pub name: &'static str,
    /// Compute slices (the "g" number).
    pub compute_slices: u32,
    /// Memory slices (= placement size).
    pub memory_slices: u32,
    pub instance_count: u32,
    pub sm: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    pub memory_mb: u64,
    /// Possible placement starts (in memory slices); size is `memory_slices`.
    pub placements: &'static [u32],
}

/// One compute instance profile row for a given GI profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiProfile {
    /// NVML_COMPUTE_INSTANCE_PROFILE_* index; CI profile ids equal the index.
    pub index: u32,
    pub id: u32,
    pub name: String,
    pub compute_slices: u32,
    pub instance_count: u32,
    pub sm: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    /// Placement starts in compute slices of the GI; size is `compute_slices`.
    pub placements: Vec<u32>,
}

const P_1G: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const P_2SLOT: &[u32] = &[0, 2, 4, 6];
const P_2G: &[u32] = &[0, 2, 4];
const P_3G: &[u32] = &[0, 4];
const P_4G: &[u32] = &[0];
const P_7G: &[u32] = &[0];

/// Engines per profile: (sm, ce, dec, enc, jpeg, ofa).
type Engines = (u32, u32, u32, u32, u32, u32);

struct Family {
    /// MiB per 1, 2, 4, 8 memory slices.
    mem: [u64; 4],
    /// Names for profiles 19, 20, 15, 14, 9, 5, 0.
    names: [&'static str; 7],
    /// Engines for profiles 19, 20, 15, 14, 9, 5, 0.
    engines: [Engines; 7],
}

const AMPERE_ENGINES: [Engines; 7] = [
    (14, 1, 0, 0, 0, 0),
    (14, 1, 1, 0, 1, 1),
    (14, 1, 1, 0, 0, 0),
    (28, 2, 1, 0, 0, 0),
    (42, 3, 2, 0, 0, 0),
    (56, 4, 2, 0, 0, 0),
    (98, 7, 5, 0, 1, 1),
];
const HOPPER_ENGINES: [Engines; 7] = [
    (16, 1, 1, 0, 1, 0),
    (16, 1, 1, 0, 1, 1),
    (26, 1, 1, 0, 1, 0),
    (32, 2, 2, 0, 2, 0),
    (60, 3, 3, 0, 3, 0),
    (64, 4, 4, 0, 4, 0),
    (132, 8, 7, 0, 7, 1),
];

const A100_40: Family = Family {
    mem: [4864, 9856, 19968, 40192],
    names: [
        "1g.5gb",
        "1g.5gb+me",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ],
    engines: AMPERE_ENGINES,
};
const A100_80: Family = Family {
    mem: [9728, 19968, 40192, 80896],
    names: [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ],
    engines: AMPERE_ENGINES,
};
const H100_80: Family = Family {
    mem: [9984, 20096, 40448, 81152],
    names: [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ],
    engines: HOPPER_ENGINES,
};
// H200 memory sizes as a real H200 (driver 580.159.04, MIG mode disabled) reports them through
// NVML, read with tools/compare-real-gpu.py on 2026-11-29; every other field already matched.
const H200_141: Family = Family {
    mem: [16384, 33280, 71424, 143360],
    names: [
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ],
    engines: HOPPER_ENGINES,
};

const fn row(f: &Family, k: usize, index: u32, id: u32) -> GiProfile {
    // (compute slices, memory slices, count, placements) per row k.
    let (g, m, count, placements): (u32, u32, u32, &'static [u32]) = match k {
        0 => (1, 1, 7, P_1G),
        1 => (1, 1, 1, P_1G),
        2 => (1, 2, 4, P_2SLOT),
        3 => (2, 2, 3, P_2G),
        4 => (3, 4, 2, P_3G),
        5 => (4, 4, 1, P_4G),
        _ => (7, 8, 1, P_7G),
    };
    let mem = match m {
        1 => f.mem[0],
        2 => f.mem[1],
        4 => f.mem[2],
        _ => f.mem[3],
    };
    let e = f.engines[k];
    GiProfile {
        index,
        id,
        name: f.names[k],
        compute_slices: g,
        memory_slices: m,
        instance_count: count,
        sm: e.0,
        copy_engines: e.1,
        decoders: e.2,
        encoders: e.3,
        jpegs: e.4,
        ofas: e.5,
        memory_mb: mem,
        placements,
    }
}

const fn table(f: &Family) -> [GiProfile; 7] {
    // NVML_GPU_INSTANCE_PROFILE_1_SLICE=0 -> id 19, 1_SLICE_REV1=7 -> 20 (+me),
    // 1_SLICE_REV2=9 -> 15 (double memory), 2_SLICE=1 -> 14, 3_SLICE=2 -> 9,
    // 4_SLICE=3 -> 5, 7_SLICE=4 -> 0.
    [
        row(f, 0, 0x0, 19),
        row(f, 1, 0x7, 20),
        row(f, 2, 0x9, 15),
        row(f, 3, 0x1, 14),
        row(f, 4, 0x2, 9),
        row(f, 5, 0x3, 5),
        row(f, 6, 0x4, 0),
    ]
}

static A100_40_TABLE: [GiProfile; 7] = table(&A100_40);
static A100_80_TABLE: [GiProfile; 7] = table(&A100_80);
static H100_80_TABLE: [GiProfile; 7] = table(&H100_80);
static H200_141_TABLE: [GiProfile; 7] = table(&H200_141);

impl GpuModel {
    pub const ALL: [GpuModel; 4] = [
        GpuModel::A100_40GB,
        GpuModel::A100_80GB,
        GpuModel::H100_80GB,
        GpuModel::H200_141GB,
    ];

    /// Accepts the short keys ("H200-141GB") and common product spellings
    /// ("NVIDIA H200", "A100-SXM4-40GB", "H100 80GB HBM3"), case-insensitively.
    pub fn parse(s: &str) -> Option<GpuModel> {
        let k: String = s
            .to_ascii_uppercase()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        let k = k.strip_prefix("NVIDIA").unwrap_or(&k);
        match k {
            "A10040GB" | "A100SXM440GB" | "A100PCIE40GB" => Some(GpuModel::A100_40GB),
            "A10080GB" | "A100SXM480GB" | "A100PCIE80GB" => Some(GpuModel::A100_80GB),
            "H10080GB" | "H10080GBHBM3" | "H100SXM580GB" | "H100PCIE" | "H100" => {
                Some(GpuModel::H100_80GB)
            }
            "H200141GB" | "H200" | "H200SXM141GB" | "H200NVL" => Some(GpuModel::H200_141GB),
            _ => None,
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            GpuModel::A100_40GB => "A100-40GB",
            GpuModel::A100_80GB => "A100-80GB",
            GpuModel::H100_80GB => "H100-80GB",
            GpuModel::H200_141GB => "H200-141GB",
        }
    }

    /// Product name as nvmlDeviceGetName reports it.
    pub fn product_name(self) -> &'static str {
        match self {
            GpuModel::A100_40GB => "NVIDIA A100-SXM4-40GB",
            GpuModel::A100_80GB => "NVIDIA A100-SXM4-80GB",
            GpuModel::H100_80GB => "NVIDIA H100 80GB HBM3",
            GpuModel::H200_141GB => "NVIDIA H200",
        }
    }

    /// Total framebuffer in bytes (nvmlDeviceGetMemoryInfo.total).
    pub fn memory_total_bytes(self) -> u64 {
        let mib: u64 = match self {
            GpuModel::A100_40GB => 40960,
            GpuModel::A100_80GB => 81920,
            GpuModel::H100_80GB => 81559,
            GpuModel::H200_141GB => 143771,
        };
        mib << 20
    }

    pub fn gi_profiles(self) -> &'static [GiProfile] {
        match self {
            GpuModel::A100_40GB => &A100_40_TABLE,
            GpuModel::A100_80GB => &A100_80_TABLE,
            GpuModel::H100_80GB => &H100_80_TABLE,
            GpuModel::H200_141GB => &H200_141_TABLE,
        }
    }

    /// GI profile by NVML_GPU_INSTANCE_PROFILE_* index.
    pub fn gi_profile_by_index(self, index: u32) -> Option<&'static GiProfile> {
        self.gi_profiles().iter().find(|p| p.index == index)
    }

    /// GI profile by profile id (19, 20, 15, 14, 9, 5, 0).
    pub fn gi_profile_by_id(self, id: u32) -> Option<&'static GiProfile> {
        self.gi_profiles().iter().find(|p| p.id == id)
    }
}

impl std::fmt::Display for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// Compute slice counts per NVML_COMPUTE_INSTANCE_PROFILE_* index (None: not a modelled size).
fn ci_index_slices(index: u32) -> Option<u32> {
    match index {
        0 => Some(1),
        1 => Some(2),
        2 => Some(3),
        3 => Some(4),
        4 => Some(7),
        _ => None,
    }
}

/// Placement starts for a CI of `c` compute slices in a GI of `g` compute slices.
fn ci_placements(g: u32, c: u32) -> Vec<u32> {
    let align = match c {
        1 => 1,
        2 => 2,
        _ => 4,
    };
    (0..g)
        .step_by(align as usize)
        .filter(|s| s + c <= g)
        .collect()
}

/// The CI profile with NVML_COMPUTE_INSTANCE_PROFILE_* `index` inside a GI of profile `gi`,
/// or None when the GI does not offer it.
pub fn ci_profile(model: GpuModel, gi: &GiProfile, index: u32) -> Option<CiProfile> {
    let c = ci_index_slices(index)?;
    let g = gi.compute_slices;
    if c > g || (g != 7 && c == 7) {
        return None;
    }
    let placements = ci_placements(g, c);
    if placements.is_empty() {
        return None;
    }
    let (sm, name) = if c == g {
        (gi.sm, format!("MIG {}", gi.name))
    } else {
        // A partial CI gets the SM count of the plain GI profile with the same slice count.
        let same = model
            .gi_profiles()
            .iter()
            .find(|p| p.compute_slices == c && p.index != 0x7 && p.index != 0x9)
            .map(|p| p.sm)
            .unwrap_or(gi.sm / g * c);
        (same, format!("MIG {}c.{}", c, gi.name))
    };
    Some(CiProfile {
        index,
        id: index,
        name,
        compute_slices: c,
        instance_count: placements.len() as u32,
        sm,
        copy_engines: gi.copy_engines,
        decoders: gi.decoders,
        encoders: gi.encoders,
        jpegs: gi.jpegs,
        ofas: gi.ofas,
        placements,
    })
}

/// All CI profiles a GI of profile `gi` offers, by ascending index.
pub fn ci_profiles(model: GpuModel, gi: &GiProfile) -> Vec<CiProfile> {
    (0..CI_PROFILE_INDEX_COUNT)
        .filter_map(|i| ci_profile(model, gi, i))
        .collect()
}

/// GI id the driver assigns to a GI at memory placement (start, size): the swizzle id.
/// 0 = whole GPU, 1-2 = halves, 3-6 = quarters, 7-14 = eighths.
pub fn gi_id_for_placement(start: u32, size: u32) -> u32 {
    match size {
        8 => 0,
        4 => 1 + start / 4,
        2 => 3 + start / 2,
        _ => 7 + start,
    }
}

/// Minor of `gpu<N>/gi<G>/access` in /proc/driver/nvidia-caps/mig-minors.
pub fn gi_access_minor(gpu: u32, gi: u32) -> u32 {
    3 + gpu * MINORS_PER_GPU + gi * (1 + MAX_CI_IDS)
}

/// Minor of `gpu<N>/gi<G>/ci<C>/access`.
pub fn ci_access_minor(gpu: u32, gi: u32, ci: u32) -> u32 {
    gi_access_minor(gpu, gi) + 1 + ci
}

/// Minor of the `config` capability.
pub const CONFIG_MINOR: u32 = 1;
/// Minor of the `monitor` capability.
pub const MONITOR_MINOR: u32 = 2;

/// Full text of the driver's mig-minors file (static: every GPU, GI and CI id).
pub fn mig_minors_text() -> String {
    // Every nvmlInit compares the file with this text: 4,322 lines, written as bytes (format!
    // per line cost the prolog most of a millisecond).
    let mut s: Vec<u8> = Vec::with_capacity(160 * 1024);
    let mut line = |parts: &[&str], nums: &[u32], minor: u32| {
        for (part, n) in parts.iter().zip(nums) {
            s.extend_from_slice(part.as_bytes());
            push_u32(&mut s, *n);
        }
        s.extend_from_slice(parts[nums.len()].as_bytes());
        push_u32(&mut s, minor);
        s.push(b'\n');
    };
    line(&["config "], &[], CONFIG_MINOR);
    line(&["monitor "], &[], MONITOR_MINOR);
    for gpu in 0..MIG_MINORS_GPUS {
        for gi in 0..MAX_GI_IDS {
            line(
                &["gpu", "/gi", "/access "],
                &[gpu, gi],
                gi_access_minor(gpu, gi),
            );
            for ci in 0..MAX_CI_IDS {
                line(
                    &["gpu", "/gi", "/ci", "/access "],
                    &[gpu, gi, ci],
                    ci_access_minor(gpu, gi, ci),
                );
            }
        }
    }
    String::from_utf8(s).expect("ASCII")
}

/// Appends `n` in decimal.
fn push_u32(s: &mut Vec<u8>, mut n: u32) {
    let mut buf = [0u8; 10];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod text_tests {
    use super::*;

    #[test]
    fn mig_minors_text_is_the_driver_format() {
        // The same table written the obvious way.
        let mut want = format!("config {CONFIG_MINOR}\nmonitor {MONITOR_MINOR}\n");
        for gpu in 0..MIG_MINORS_GPUS {
            for gi in 0..MAX_GI_IDS {
                want += &format!("gpu{gpu}/gi{gi}/access {}\n", gi_access_minor(gpu, gi));
                for ci in 0..MAX_CI_IDS {
                    want += &format!(
                        "gpu{gpu}/gi{gi}/ci{ci}/access {}\n",
                        ci_access_minor(gpu, gi, ci)
                    );
                }
            }
        }
        assert_eq!(mig_minors_text(), want);
        let mut s = Vec::new();
        for n in [0, 7, 10, 4_294_967_295] {
            push_u32(&mut s, n);
            s.push(b' ');
        }
        assert_eq!(s, b"0 7 10 4294967295 ");
    }
}
