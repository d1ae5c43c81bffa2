//! Fault paths through the real NVML code path (nvml-shim faults).

mod common;
use common::{Scenario, TWO_H200};
use tenancy_mig::*;

fn req(profile: &str) -> Request {
    Request {
        profile: Some(profile.into()),
        slot: None,
        tenant: "acme".into(),
        share_gpu: true,
    }
}

#[test]
fn ci_creation_failure_destroys_the_gi() {
    let Some(sc) = Scenario::new(TWO_H200, Some("ci_create=INSUFFICIENT_RESOURCES")) else {
        return;
    };
    let mig = sc.open();
    let intent = mig.choose(&req("3g.71gb"), &[]).unwrap();
    let e = mig.create(&intent).unwrap_err();
    let s = e.to_string();
    assert!(s.starts_with("mig: GPU "), "{s}");
    assert!(
        s.contains("nothing leaked") && s.contains("nvmlGpuInstanceCreateComputeInstance"),
        "{s}"
    );
    assert!(
        s.contains("3g.71gb") && s.contains(&format!("placement {}:4", intent.placement_start)),
        "{s}"
    );
    // No instance in the shim's state: the GI was destroyed again.
    assert!(sc.gis().is_empty(), "leaked: {:?}", sc.gis());
    assert!(mig
        .instances()
        .unwrap()
        .iter()
        .all(|v| v.instances.is_empty()));
    // The fault was one-shot: the retry works and the placement is free again.
    let slice = mig.create(&intent).unwrap();
    assert_eq!(sc.gis().len(), 1);
    mig.destroy(&intent, Some(&slice)).unwrap();
}

#[test]
fn gi_creation_failure_is_named() {
    let Some(sc) = Scenario::new(TWO_H200, Some("gi_create=INSUFFICIENT_RESOURCES")) else {
        return;
    };
    let mig = sc.open();
    let intent = mig.choose(&req("1g.18gb"), &[]).unwrap();
    let e = mig.create(&intent).unwrap_err();
    assert_eq!(e.nvml_code(), Some(23), "{e}");
    let s = e.to_string();
    assert!(
        s.contains("nvmlDeviceCreateGpuInstanceWithPlacement") && s.contains("reconcile"),
        "{s}"
    );
    assert!(sc.gis().is_empty());
}

#[test]
fn in_use_on_destroy_is_retried_then_succeeds() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mig = sc.open();
    let intent = mig.choose(&req("2g.35gb"), &[]).unwrap();
    let slice = mig.create(&intent).unwrap();
    drop(mig);
    // The epilog's session: the first 3 destroy calls answer IN_USE.
    sc.set_faults(Some("destroy_in_use=3"));
    let mut mig = sc.open();
    mig.retry = RetryPolicy {
        attempts: 5,
        backoff_ms: 1,
        ..RetryPolicy::default()
    };
    let t = mig.destroy(&intent, Some(&slice)).unwrap();
    assert_eq!(t.in_use_retries, 3, "{t:?}");
    assert_eq!((t.ci, t.gi), (Outcome::Destroyed, Outcome::Destroyed));
    assert!(sc.gis().is_empty());
}

#[test]
fn in_use_persisting_fails_loudly_then_recovers() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mig = sc.open();
    let intent = mig.choose(&req("1g.18gb"), &[]).unwrap();
    let slice = mig.create(&intent).unwrap();
    drop(mig);
    sc.set_faults(Some("destroy_in_use=1000"));
    let mut mig = sc.open();
    mig.retry = RetryPolicy {
        attempts: 4,
        backoff_ms: 1,
        ..RetryPolicy::default()
    };
    let started = std::time::Instant::now();
    let e = mig.destroy(&intent, Some(&slice)).unwrap_err();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "bounded"
    );
    let s = e.to_string();
    assert!(matches!(e, MigError::InUse { attempts: 4, .. }), "{s}");
    assert!(
        s.contains(&format!("GPU {}", intent.gpu_index))
            && s.contains(&format!("GI {}", slice.gi_id)),
        "{s}"
    );
    assert!(
        s.contains("IN_USE") && s.contains("reconcile") && s.contains("drained"),
        "{s}"
    );
    // Nothing was destroyed.
    assert_eq!(sc.gis().len(), 1);
    drop(mig);
    // Once the holder is gone, the epilog rerun cleans up.
    sc.set_faults(None);
    let mig = sc.open();
    let t = mig.destroy(&intent, Some(&slice)).unwrap();
    assert_eq!(t.gi, Outcome::Destroyed);
    assert!(sc.gis().is_empty());
}

#[test]
fn mig_disabled_and_unknown_profile_refused() {
    let fx = "[[gpus]]\nmodel = \"A100-40GB\"\nmig_mode = false\n\n[[gpus]]\nmodel = \"A100-40GB\"\nmig_mode = true\n";
    let Some(sc) = Scenario::new(fx, None) else {
        return;
    };
    let mig = sc.open();
    let g = mig.gpus().unwrap();
    assert_eq!(g[0].model, Some(GpuModel::A100_40GB));
    assert!(!g[0].mig_enabled && g[1].mig_enabled);
    assert!(matches!(
        mig.plan_gpus(true).unwrap_err(),
        MigError::MigDisabled { gpu: 0, .. }
    ));
    // Placement goes to the MIG-enabled GPU only.
    let i = mig.choose(&req("3g.20gb"), &[]).unwrap();
    assert_eq!(i.gpu_index, 1);
    let m = mig.create(&i).unwrap();
    mig.destroy(&i, Some(&m)).unwrap();
    // H200 names do not exist on an A100.
    assert!(matches!(
        mig.choose(&req("1g.18gb"), &[]).unwrap_err(),
        MigError::UnknownProfile { .. }
    ));
    // Forcing an intent onto the MIG-disabled GPU is refused before any NVML create.
    let bad = MigIntent {
        gpu_index: 0,
        gpu_uuid: g[0].uuid.clone(),
        ..i
    };
    assert!(matches!(
        mig.create(&bad).unwrap_err(),
        MigError::MigDisabled { .. }
    ));
    assert!(sc.gis().is_empty());
}

#[test]
fn missing_library_is_a_clear_error() {
    let e = Mig::open(Some(std::path::Path::new("/nonexistent/libnvidia-ml.so.1")))
        .err()
        .unwrap();
    let s = e.to_string();
    assert!(
        s.starts_with("mig: cannot load NVML library /nonexistent/") && s.contains("nvml_library"),
        "{s}"
    );
}
