//! Fixture (TOML, `NVML_SHIM_FIXTURE`) and environment configuration.

use crate::model::GpuModel;
use crate::ret;
use crate::state::{Faults, GpuSeed};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const ENV_FIXTURE: &str = "NVML_SHIM_FIXTURE";
pub const ENV_STATE: &str = "NVML_SHIM_STATE";
pub const ENV_FAULTS: &str = "NVML_SHIM_FAULTS";
pub const DEFAULT_STATE: &str = "/tmp/nvml-shim/state.json";
pub const DEFAULT_DRIVER_VERSION: &str = "570.124.06";
pub const DEFAULT_UVM_MAJOR: u32 = 509;
pub const DEFAULT_CAPS_MAJOR: u32 = 508;
/// Major of /dev/nvidia<N> and /dev/nvidiactl.
pub const NVIDIA_MAJOR: u32 = 195;
pub const NVIDIACTL_MINOR: u32 = 255;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureFile {
    #[serde(default)]
    gpus: Vec<FixtureGpu>,
    state: Option<PathBuf>,
    dev_dir: Option<PathBuf>,
    mig_minors: Option<PathBuf>,
    proc_devices: Option<PathBuf>,
    uvm_major: Option<u32>,
    caps_major: Option<u32>,
    driver_version: Option<String>,
    /// The stand-in makes and removes each GPU and compute instance's nvidia-caps node itself
    /// (the real driver does not: nvidia-modprobe or the prolog makes them).
    #[serde(default)]
    instance_caps: bool,
    /// DCGM exporter's job mapping folder, watched for files left behind (see README).
    dcgm_job_mapping_dir: Option<PathBuf>,
    #[serde(default)]
    faults: FixtureFaults,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureGpu {
    model: String,
    uuid: Option<String>,
    #[serde(default = "yes")]
    mig_mode: bool,
    /// The pending MIG mode (default: `mig_mode`): differs while a change waits for a reset.
    mig_mode_pending: Option<bool>,
    #[serde(default)]
    lost: bool,
    /// Confidential-computing mode (H100 and H200 only).
    #[serde(default)]
    cc_mode: bool,
    /// MIG mode changes wait for a GPU reset (as in a VM with the GPU passed through).
    #[serde(default)]
    reset_required: bool,
    /// Profile names the driver reports instead of the model's: `{ "3g.40gb" = "3g.39gb" }`.
    #[serde(default)]
    profile_names: std::collections::BTreeMap<String, String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureFaults {
    #[serde(default)]
    gi_create: Vec<String>,
    #[serde(default)]
    ci_create: Vec<String>,
    #[serde(default)]
    destroy_in_use: u32,
    /// GPU indices that are lost from the start.
    #[serde(default)]
    lost: Vec<u32>,
    #[serde(default)]
    create_delay_ms: u64,
    #[serde(default)]
    destroy_delay_ms: u64,
}

/// Resolved configuration of one process.
#[derive(Debug, Clone)]
pub struct Config {
    pub gpus: Vec<GpuSeed>,
    pub state_path: PathBuf,
    pub dev_dir: Option<PathBuf>,
    pub mig_minors: Option<PathBuf>,
    pub proc_devices: Option<PathBuf>,
    pub uvm_major: u32,
    pub caps_major: u32,
    pub driver_version: String,
    /// Faults from the fixture: copied into a newly created state file.
    pub seed_faults: Faults,
    /// Faults from NVML_SHIM_FAULTS: consumed by this process only.
    pub env_faults: Faults,
    /// GPU indices lost for this process (NVML_SHIM_FAULTS `lost=`).
    pub env_lost: Vec<u32>,
    pub fixture: Option<PathBuf>,
    /// Per-instance nvidia-caps nodes made by the stand-in (fixture `instance_caps`).
    pub instance_caps: bool,
    /// DCGM exporter's job mapping folder (fixture `dcgm_job_mapping_dir`).
    pub dcgm_mapping_dir: Option<PathBuf>,
}

/// Profile names a driver release reports differently from the model's table: 535 and 545
/// call the A100-80GB's 3g.40gb "3g.39gb" (NVIDIA/mig-parted issue 31: Slurm's AutoDetect then
/// named the GRES type nvidia_a100_3g.39gb and dropped the configured 3g.40gb).
pub fn driver_renames(driver_version: &str, model: GpuModel) -> BTreeMap<String, String> {
    let major = driver_version.split('.').next().unwrap_or("");
    let mut m = BTreeMap::new();
    if matches!(major, "535" | "545") && model == GpuModel::A100_80GB {
        m.insert("3g.40gb".to_string(), "3g.39gb".to_string());
    }
    m
}

/// A profile name as drivers write them: `<g>g.<n>gb`, optionally `+me`.
fn valid_profile_name(s: &str) -> bool {
    let s = s.strip_suffix("+me").unwrap_or(s);
    let Some((g, rest)) = s.split_once("g.") else {
        return false;
    };
    let Some(n) = rest.strip_suffix("gb") else {
        return false;
    };
    !g.is_empty()
        && g.bytes().all(|b| b.is_ascii_digit())
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
}

/// Deterministic `GPU-<uuid>` for a GPU without one in the fixture.
pub fn default_gpu_uuid(index: usize, model: GpuModel) -> String {
    let u = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("nvml-shim/gpu/{index}/{}", model.key()).as_bytes(),
    );
    format!("GPU-{u}")
}

/// Stable `MIG-<uuid>` for (GPU uuid, GI id, CI id).
pub fn mig_uuid(gpu_uuid: &str, gi: u32, ci: u32) -> String {
    let u = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("nvml-shim/mig/{gpu_uuid}/{gi}/{ci}").as_bytes(),
    );
    format!("MIG-{u}")
}

fn valid_gpu_uuid(s: &str) -> bool {
    s.strip_prefix("GPU-")
        .map(|r| uuid::Uuid::parse_str(r).is_ok() && r.len() == 36)
        .unwrap_or(false)
}

fn parse_codes(list: &[String], what: &str) -> Result<Vec<u32>, String> {
    list.iter()
        .map(|c| {
            ret::parse(c).map(|r| r.0).ok_or_else(|| {
                format!("{what}: unknown NVML error {c:?} (use a name like INSUFFICIENT_RESOURCES or a number)")
            })
        })
        .collect()
}

/// Parses NVML_SHIM_FAULTS: `gi_create=CODE[,CODE..];ci_create=CODE;destroy_in_use=N;
/// lost=IDX[,IDX];create_delay_ms=N;destroy_delay_ms=N`.
pub fn parse_env_faults(spec: &str) -> Result<(Faults, Vec<u32>), String> {
    let mut f = Faults::default();
    let mut lost = Vec::new();
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{ENV_FAULTS}: expected key=value, got {part:?}"))?;
        let items: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
        match k.trim() {
            "gi_create" => f.gi_create.extend(parse_codes(&items, ENV_FAULTS)?),
            "ci_create" => f.ci_create.extend(parse_codes(&items, ENV_FAULTS)?),
            "destroy_in_use" => {
                f.destroy_in_use = v
                    .trim()
                    .parse()
                    .map_err(|_| format!("{ENV_FAULTS}: destroy_in_use needs a count, got {v:?}"))?
            }
            "create_delay_ms" | "destroy_delay_ms" => {
                let ms = v.trim().parse().map_err(|_| {
                    format!("{ENV_FAULTS}: {k} needs milliseconds, got {v:?}")
                })?;
                if k.trim() == "create_delay_ms" {
                    f.create_delay_ms = ms;
                } else {
                    f.destroy_delay_ms = ms;
                }
            }
            "lost" => {
                for i in items {
                    lost.push(
                        i.parse().map_err(|_| {
                            format!("{ENV_FAULTS}: lost needs GPU indices, got {i:?}")
                        })?,
                    );
                }
            }
            other => {
                return Err(format!(
                "{ENV_FAULTS}: unknown key {other:?} (gi_create, ci_create, destroy_in_use, lost, create_delay_ms, destroy_delay_ms)"
            ))
            }
        }
    }
    Ok((f, lost))
}

fn resolve(base: &Path, p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        p
    } else {
        base.join(p)
    }
}

impl Config {
    /// Configuration from the environment: fixture from NVML_SHIM_FIXTURE (or two H200-141GB
    /// with MIG enabled), state from NVML_SHIM_STATE, the fixture's `state`, or
    /// /tmp/nvml-shim/state.json.
    pub fn from_env() -> Result<Config, String> {
        let fixture = std::env::var_os(ENV_FIXTURE)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let mut cfg = match &fixture {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    format!("cannot read fixture {} ({ENV_FIXTURE}): {e}", p.display())
                })?;
                Config::from_fixture_text(&text, p.parent().unwrap_or(Path::new("/")))
                    .map_err(|e| format!("fixture {}: {e}", p.display()))?
            }
            None => Config::default_two_h200(),
        };
        cfg.fixture = fixture;
        if let Some(s) = std::env::var_os(ENV_STATE).filter(|v| !v.is_empty()) {
            cfg.state_path = PathBuf::from(s);
        }
        if let Ok(spec) = std::env::var(ENV_FAULTS) {
            let (f, lost) = parse_env_faults(&spec)?;
            cfg.env_faults = f;
            cfg.env_lost = lost;
        }
        Ok(cfg)
    }

    pub fn default_two_h200() -> Config {
        let gpus = (0..2)
            .map(|i| {
                GpuSeed::mig(
                    default_gpu_uuid(i, GpuModel::H200_141GB),
                    GpuModel::H200_141GB,
                )
            })
            .collect();
        Config {
            gpus,
            state_path: PathBuf::from(DEFAULT_STATE),
            dev_dir: None,
            mig_minors: None,
            proc_devices: None,
            uvm_major: DEFAULT_UVM_MAJOR,
            caps_major: DEFAULT_CAPS_MAJOR,
            driver_version: DEFAULT_DRIVER_VERSION.into(),
            seed_faults: Faults::default(),
            env_faults: Faults::default(),
            env_lost: Vec::new(),
            fixture: None,
            instance_caps: false,
            dcgm_mapping_dir: None,
        }
    }

    /// Parses fixture text; relative paths resolve against `base` (the fixture's folder).
    pub fn from_fixture_text(text: &str, base: &Path) -> Result<Config, String> {
        let f: FixtureFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if f.gpus.is_empty() {
            return Err("no [[gpus]] entries".into());
        }
        if f.gpus.len() > crate::model::MIG_MINORS_GPUS as usize {
            return Err(format!("at most {} GPUs", crate::model::MIG_MINORS_GPUS));
        }
        let driver_version = f
            .driver_version
            .clone()
            .unwrap_or_else(|| DEFAULT_DRIVER_VERSION.into());
        let mut gpus = Vec::new();
        for (i, g) in f.gpus.iter().enumerate() {
            let model = GpuModel::parse(&g.model).ok_or_else(|| {
                format!(
                    "gpus[{i}]: unknown model {:?} (one of A100-40GB, A100-80GB, H100-80GB, H200-141GB)",
                    g.model
                )
            })?;
            let uuid = match &g.uuid {
                Some(u) if valid_gpu_uuid(u) => u.clone(),
                Some(u) => {
                    return Err(format!(
                        "gpus[{i}]: uuid {u:?} is not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
                    ))
                }
                None => default_gpu_uuid(i, model),
            };
            if gpus.iter().any(|s: &GpuSeed| s.uuid == uuid) {
                return Err(format!("gpus[{i}]: duplicate uuid {uuid}"));
            }
            if g.cc_mode && !matches!(model, GpuModel::H100_80GB | GpuModel::H200_141GB) {
                return Err(format!(
                    "gpus[{i}]: cc_mode: a {model} has no confidential-computing mode (Hopper GPUs do)"
                ));
            }
            let mut renames = driver_renames(&driver_version, model);
            for (from, to) in &g.profile_names {
                if !model.gi_profiles().iter().any(|p| p.name == from) {
                    return Err(format!(
                        "gpus[{i}]: profile_names: {from:?} is not a {model} profile"
                    ));
                }
                if !valid_profile_name(to) {
                    return Err(format!(
                        "gpus[{i}]: profile_names: {to:?} is not a profile name like 3g.39gb"
                    ));
                }
                renames.insert(from.clone(), to.clone());
            }
            gpus.push(GpuSeed {
                uuid,
                model,
                mig_mode: g.mig_mode,
                mig_pending: g.mig_mode_pending.unwrap_or(g.mig_mode),
                lost: g.lost || f.faults.lost.contains(&(i as u32)),
                cc_mode: g.cc_mode,
                reset_required: g.reset_required,
                renames,
            });
        }
        let uvm_major = f.uvm_major.unwrap_or(DEFAULT_UVM_MAJOR);
        let caps_major = f.caps_major.unwrap_or(DEFAULT_CAPS_MAJOR);
        for (n, m) in [("uvm_major", uvm_major), ("caps_major", caps_major)] {
            if m == 0 || m == NVIDIA_MAJOR || m > 4095 {
                return Err(format!("{n} = {m}: must be 1..=4095 and not 195"));
            }
        }
        if uvm_major == caps_major {
            return Err("uvm_major and caps_major must differ".into());
        }
        Ok(Config {
            gpus,
            state_path: f
                .state
                .map(|p| resolve(base, p))
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE)),
            dev_dir: f.dev_dir.map(|p| resolve(base, p)),
            mig_minors: f.mig_minors.map(|p| resolve(base, p)),
            proc_devices: f.proc_devices.map(|p| resolve(base, p)),
            uvm_major,
            caps_major,
            driver_version,
            seed_faults: Faults {
                gi_create: parse_codes(&f.faults.gi_create, "faults.gi_create")?,
                ci_create: parse_codes(&f.faults.ci_create, "faults.ci_create")?,
                destroy_in_use: f.faults.destroy_in_use,
                create_delay_ms: f.faults.create_delay_ms,
                destroy_delay_ms: f.faults.destroy_delay_ms,
            },
            env_faults: Faults::default(),
            env_lost: Vec::new(),
            fixture: None,
            instance_caps: f.instance_caps,
            dcgm_mapping_dir: f.dcgm_job_mapping_dir.map(|p| resolve(base, p)),
        })
    }

    /// NVML version string: "12." + driver version (as NVML reports it).
    pub fn nvml_version(&self) -> String {
        format!("12.{}", self.driver_version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture_parses_and_resolves_paths() {
        let c = Config::from_fixture_text(
            r#"
state = "st.json"
dev_dir = "/tmp/x/dev"
[[gpus]]
model = "A100-40GB"
mig_mode = false
[[gpus]]
model = "NVIDIA H200"
uuid = "GPU-12345678-1234-1234-1234-123456789abc"
[faults]
gi_create = ["INSUFFICIENT_RESOURCES"]
lost = [0]
"#,
            Path::new("/base"),
        )
        .unwrap();
        assert_eq!(c.state_path, PathBuf::from("/base/st.json"));
        assert_eq!(c.gpus.len(), 2);
        assert_eq!(c.gpus[0].model, GpuModel::A100_40GB);
        assert!(!c.gpus[0].mig_mode && c.gpus[0].lost);
        assert!(c.gpus[0].uuid.starts_with("GPU-"));
        assert_eq!(c.gpus[1].model, GpuModel::H200_141GB);
        assert_eq!(c.seed_faults.gi_create, vec![23]);
    }

    #[test]
    fn fixture_errors_name_the_field() {
        let e =
            Config::from_fixture_text("[[gpus]]\nmodel = \"V100\"\n", Path::new("/")).unwrap_err();
        assert!(e.contains("gpus[0]") && e.contains("V100"), "{e}");
        let e = Config::from_fixture_text("[[gpus]]\nmodel=\"H200\"\nuuid=\"x\"\n", Path::new("/"))
            .unwrap_err();
        assert!(e.contains("uuid"), "{e}");
        assert!(
            Config::from_fixture_text("bogus = 1\n[[gpus]]\nmodel=\"H200\"\n", Path::new("/"))
                .is_err()
        );
    }

    #[test]
    fn driver_era_names_cc_and_pending_modes() {
        let c = Config::from_fixture_text(
            "driver_version = \"535.129.03\"\n[[gpus]]\nmodel = \"A100-80GB\"\n\
             mig_mode_pending = false\nreset_required = true\n\
             [[gpus]]\nmodel = \"H200-141GB\"\ncc_mode = true\n\
             profile_names = { \"3g.71gb\" = \"3g.70gb\" }\n",
            Path::new("/"),
        )
        .unwrap();
        let p3 = GpuModel::A100_80GB.gi_profile_by_id(9).unwrap();
        assert_eq!(c.gpus[0].profile_name(p3), "3g.39gb");
        assert!(c.gpus[0].mig_mode && !c.gpus[0].mig_pending && c.gpus[0].reset_required);
        let h3 = GpuModel::H200_141GB.gi_profile_by_id(9).unwrap();
        assert_eq!(c.gpus[1].profile_name(h3), "3g.70gb");
        assert!(c.gpus[1].cc_mode);
        // The default driver keeps the table's names.
        assert!(driver_renames(DEFAULT_DRIVER_VERSION, GpuModel::A100_80GB).is_empty());
        for bad in [
            "[[gpus]]\nmodel = \"A100-40GB\"\ncc_mode = true\n",
            "[[gpus]]\nmodel = \"H200\"\nprofile_names = { \"3g.40gb\" = \"3g.39gb\" }\n",
            "[[gpus]]\nmodel = \"H200\"\nprofile_names = { \"3g.71gb\" = \"big\" }\n",
        ] {
            assert!(
                Config::from_fixture_text(bad, Path::new("/")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn env_faults_spec() {
        let (f, lost) =
            parse_env_faults("gi_create=INSUFFICIENT_RESOURCES,UNKNOWN; destroy_in_use=2;lost=1")
                .unwrap();
        assert_eq!(f.gi_create, vec![23, 999]);
        assert_eq!(f.destroy_in_use, 2);
        assert_eq!(lost, vec![1]);
        assert!(parse_env_faults("gi_create=NOPE").is_err());
        let (f, _) = parse_env_faults("create_delay_ms=250;destroy_delay_ms=5").unwrap();
        assert_eq!((f.create_delay_ms, f.destroy_delay_ms), (250, 5));
        assert!(parse_env_faults("what=1").is_err());
    }

    #[test]
    fn uuids_are_stable_and_distinct() {
        let a = mig_uuid("GPU-1", 7, 0);
        assert_eq!(a, mig_uuid("GPU-1", 7, 0));
        assert_ne!(a, mig_uuid("GPU-1", 7, 1));
        assert_ne!(a, mig_uuid("GPU-2", 7, 0));
        assert!(a.starts_with("MIG-") && a.len() == 40);
        assert!(valid_gpu_uuid(&default_gpu_uuid(0, GpuModel::H200_141GB)));
    }
}
