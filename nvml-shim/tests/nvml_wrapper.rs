//! The shim loaded through nvml-wrapper 0.13 (what the tenancy MIG layer uses): dlopen by path,
//! init, enumerate, raw MIG calls through `Nvml::lib()`, and Drop's nvmlShutdown.

use nvml_wrapper::Nvml;
use std::path::PathBuf;

fn shim_path() -> PathBuf {
    // The cdylib sits next to the test binary's deps folder: target/<profile>/libnvidia_ml.so.
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("libnvidia_ml.so")
}

#[test]
fn nvml_wrapper_drives_the_shim() {
    let lib = shim_path();
    if !lib.exists() {
        panic!("cdylib {} not built", lib.display());
    }
    let dir = std::env::temp_dir().join(format!("nvml-shim-wrapper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = dir.join("fixture.toml");
    std::fs::write(
        &fixture,
        "state = \"state.json\"\n[[gpus]]\nmodel = \"A100-80GB\"\n[[gpus]]\nmodel = \"H100-80GB\"\nmig_mode = false\n",
    )
    .unwrap();
    std::env::set_var("NVML_SHIM_FIXTURE", &fixture);
    std::env::remove_var("NVML_SHIM_STATE");
    std::env::remove_var("NVML_SHIM_FAULTS");
    {
        let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
        assert_eq!(nvml.device_count().unwrap(), 2);
        let d0 = nvml.device_by_index(0).unwrap();
        assert_eq!(d0.name().unwrap(), "NVIDIA A100-SXM4-80GB");
        assert!(d0.uuid().unwrap().starts_with("GPU-"));
        assert_eq!(d0.memory_info().unwrap().total, 81920 << 20);
        let d1 = nvml.device_by_index(1).unwrap();
        assert_eq!(d1.mig_mode().unwrap().current, 0);
        // What the stand-in does not model is there, and not supported (as on a GPU without
        // the feature), rather than a missing symbol.
        assert!(matches!(
            d0.power_usage(),
            Err(nvml_wrapper::error::NvmlError::NotSupported)
        ));
        // Raw MIG calls, as the tenancy MIG layer makes them.
        unsafe {
            let sys = nvml.lib();
            let mut gi = std::ptr::null_mut();
            let r = sys.nvmlDeviceCreateGpuInstance(d0.handle(), 9, &mut gi);
            assert_eq!(r, 0);
            let mut ci = std::ptr::null_mut();
            assert_eq!(sys.nvmlGpuInstanceCreateComputeInstance(gi, 2, &mut ci), 0);
            // nvmlReturn 19 = NVML_ERROR_IN_USE
            assert_eq!(sys.nvmlGpuInstanceDestroy(gi), 19);
            assert_eq!(sys.nvmlComputeInstanceDestroy(ci), 0);
            assert_eq!(sys.nvmlGpuInstanceDestroy(gi), 0);
        }
    } // Drop -> nvmlShutdown
    let _ = std::fs::remove_dir_all(&dir);
}
