//! Shared harness: runs the real NVML code path against the nvml-shim .so, one scenario at a
//! time (NVML_SHIM_* env vars are process-global and read at nvmlInit).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use tenancy_mig::{Mig, Request};

pub mod request;

static LOCK: Mutex<()> = Mutex::new(());

pub struct Scenario {
    pub dir: tempfile::TempDir,
    pub lib: PathBuf,
    _guard: MutexGuard<'static, ()>,
}

impl Scenario {
    /// Fresh shim state with the given fixture TOML; `faults` goes to NVML_SHIM_FAULTS.
    pub fn new(fixture: &str, faults: Option<&str>) -> Option<Scenario> {
        let lib = tenancy_test_support::nvml_stand_in()?;
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let fx = dir.path().join("fixture.toml");
        std::fs::write(&fx, fixture).unwrap();
        std::env::set_var("NVML_SHIM_FIXTURE", &fx);
        std::env::set_var("NVML_SHIM_STATE", dir.path().join("state.json"));
        match faults {
            Some(f) => std::env::set_var("NVML_SHIM_FAULTS", f),
            None => std::env::remove_var("NVML_SHIM_FAULTS"),
        }
        Some(Scenario {
            dir,
            lib,
            _guard: guard,
        })
    }

    /// Change NVML_SHIM_FAULTS for the next open (e.g. a later epilog process).
    pub fn set_faults(&self, faults: Option<&str>) {
        match faults {
            Some(f) => std::env::set_var("NVML_SHIM_FAULTS", f),
            None => std::env::remove_var("NVML_SHIM_FAULTS"),
        }
    }

    pub fn open(&self) -> Mig {
        Mig::open(Some(&self.lib)).expect("open NVML shim")
    }

    /// The shim's state file, as JSON.
    pub fn state(&self) -> serde_json::Value {
        let path = self.dir.path().join("state.json");
        if !path.exists() {
            // The shim writes its state file on the first change.
            return serde_json::json!({"gpus": []});
        }
        let text = std::fs::read_to_string(path).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// (gpu index, gi id, start, size, #cis) of every GI in the shim's state file.
    pub fn gis(&self) -> Vec<(u32, u32, u32, u32, usize)> {
        let st = self.state();
        let mut out = Vec::new();
        for (i, g) in st["gpus"].as_array().unwrap().iter().enumerate() {
            for gi in g["gis"].as_array().unwrap() {
                out.push((
                    i as u32,
                    gi["id"].as_u64().unwrap() as u32,
                    gi["start"].as_u64().unwrap() as u32,
                    gi["size"].as_u64().unwrap() as u32,
                    gi["cis"].as_array().map(|c| c.len()).unwrap_or(0),
                ));
            }
        }
        out
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        std::env::remove_var("NVML_SHIM_FAULTS");
    }
}

pub const TWO_H200: &str = r#"
[[gpus]]
model = "H200-141GB"
mig_mode = true

[[gpus]]
model = "H200-141GB"
mig_mode = true
"#;
