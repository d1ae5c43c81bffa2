use super::*;
use crate::model::GpuModel::*;

fn st(model: GpuModel) -> State {
    State::fresh(&[GpuSeed::mig("GPU-test".into(), model)], Faults::default())
}
fn nf() -> FaultSources<'static> {
    FaultSources { local: None }
}

#[test]
fn profile_tables_match_the_reference() {
    let a = A100_40GB.gi_profiles();
    let got: Vec<(u32, &str, u32, u64)> = a
        .iter()
        .map(|p| (p.id, p.name, p.instance_count, p.memory_mb))
        .collect();
    assert_eq!(
        got,
        vec![
            (19, "1g.5gb", 7, 4864),
            (20, "1g.5gb+me", 1, 4864),
            (15, "1g.10gb", 4, 9856),
            (14, "2g.10gb", 3, 9856),
            (9, "3g.20gb", 2, 19968),
            (5, "4g.20gb", 1, 19968),
            (0, "7g.40gb", 1, 40192),
        ]
    );
    let names: Vec<&str> = H200_141GB.gi_profiles().iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "1g.18gb",
            "1g.18gb+me",
            "1g.35gb",
            "2g.35gb",
            "3g.71gb",
            "4g.71gb",
            "7g.141gb"
        ]
    );
    for m in GpuModel::ALL {
        for p in m.gi_profiles() {
            // Placements as in facts.md: 1g {0..6}:1, 1g double {0,2,4,6}:2, 2g {0,2,4}:2,
            // 3g {0,4}:4, 4g {0}:4, 7g {0}:8.
            let want: &[u32] = match p.id {
                19 | 20 => &[0, 1, 2, 3, 4, 5, 6],
                15 => &[0, 2, 4, 6],
                14 => &[0, 2, 4],
                9 => &[0, 4],
                _ => &[0],
            };
            assert_eq!(p.placements, want, "{m} {}", p.name);
            assert!(p.memory_mb * (8 / p.memory_slices) as u64 <= m.memory_total_bytes() >> 20);
        }
        assert!(m.gi_profile_by_index(5).is_none(), "8-slice profile absent");
        assert_eq!(m.gi_profile_by_index(0).unwrap().id, 19);
        assert_eq!(m.gi_profile_by_index(7).unwrap().id, 20);
        assert_eq!(m.gi_profile_by_index(9).unwrap().id, 15);
    }
}

#[test]
fn fill_with_1g_then_full() {
    let mut s = st(H200_141GB);
    let mut ids = vec![];
    for _ in 0..7 {
        ids.push(s.create_gi(0, 19, None, nf()).unwrap().0);
    }
    // Driver places from the highest start down; GI id = 7 + start.
    assert_eq!(ids, vec![13, 12, 11, 10, 9, 8, 7]);
    assert_eq!(
        s.create_gi(0, 19, None, nf()),
        Err(Ret::INSUFFICIENT_RESOURCES)
    );
    assert_eq!(s.gi_remaining_capacity(0, 19), Ok(0));
    assert_eq!(s.gi_remaining_capacity(0, 0), Ok(0));
}

#[test]
fn mixed_layout_and_ids() {
    let mut s = st(A100_40GB);
    assert_eq!(s.create_gi(0, 19, None, nf()).unwrap().0, 13);
    assert_eq!(s.create_gi(0, 14, None, nf()).unwrap().0, 5);
    assert_eq!(s.create_gi(0, 5, None, nf()).unwrap().0, 1);
    assert_eq!(
        s.gi_remaining_capacity(0, 19),
        Ok(0),
        "compute slices 1+2+4 = 7"
    );
    let mut s = st(A100_40GB);
    assert_eq!(s.create_gi(0, 9, None, nf()).unwrap().0, 2);
    assert_eq!(s.create_gi(0, 9, None, nf()).unwrap().0, 1);
    assert_eq!(
        s.create_gi(0, 9, None, nf()),
        Err(Ret::INSUFFICIENT_RESOURCES)
    );
}

#[test]
fn placement_rules() {
    let mut s = st(H100_80GB);
    assert_eq!(s.create_gi(0, 14, Some((2, 2)), nf()).unwrap().0, 4);
    assert_eq!(
        s.create_gi(0, 14, Some((2, 2)), nf()),
        Err(Ret::INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        s.create_gi(0, 19, Some((3, 1)), nf()),
        Err(Ret::INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        s.create_gi(0, 14, Some((1, 2)), nf()),
        Err(Ret::INVALID_ARGUMENT)
    );
    assert_eq!(
        s.create_gi(0, 14, Some((0, 1)), nf()),
        Err(Ret::INVALID_ARGUMENT)
    );
    assert_eq!(s.create_gi(0, 77, None, nf()), Err(Ret::INVALID_ARGUMENT));
    assert_eq!(s.gi_remaining_capacity(0, 14), Ok(2));
    assert_eq!(s.gi_remaining_capacity(0, 9), Ok(1), "3g at 4 still free");
    assert_eq!(s.gi_remaining_capacity(0, 19), Ok(5));
    // Only one +me instance.
    s.create_gi(0, 20, None, nf()).unwrap();
    assert_eq!(s.gi_remaining_capacity(0, 20), Ok(0));
    assert_eq!(
        s.create_gi(0, 20, None, nf()),
        Err(Ret::INSUFFICIENT_RESOURCES)
    );
}

#[test]
fn compute_instances_and_in_use() {
    let mut s = st(A100_80GB);
    let (gi, ser) = s.create_gi(0, 0, None, nf()).unwrap();
    assert_eq!(gi, 0);
    let m = A100_80GB;
    let gp = m.gi_profile_by_id(0).unwrap();
    let counts: Vec<(u32, u32)> = model::ci_profiles(m, gp)
        .iter()
        .map(|c| (c.id, c.instance_count))
        .collect();
    assert_eq!(counts, vec![(0, 7), (1, 3), (2, 2), (3, 1), (4, 1)]);
    let (c0, c0s) = s.create_ci(0, gi, ser, 2, None, nf()).unwrap();
    let (c1, _) = s.create_ci(0, gi, ser, 2, None, nf()).unwrap();
    assert_eq!((c0, c1), (0, 1));
    assert_eq!(
        s.ci_remaining_capacity(0, gi, ser, 0),
        Ok(1),
        "slice 3 only"
    );
    assert_eq!(
        s.create_ci(0, gi, ser, 4, None, nf()),
        Err(Ret::INSUFFICIENT_RESOURCES)
    );
    assert_eq!(s.destroy_gi(0, gi, ser, nf(), false), Err(Ret::IN_USE));
    s.destroy_ci(0, gi, ser, c0, c0s, nf(), false).unwrap();
    assert_eq!(
        s.destroy_ci(0, gi, ser, c0, c0s, nf(), false),
        Err(Ret::INVALID_ARGUMENT),
        "stale handle"
    );
    let (c, _) = s.create_ci(0, gi, ser, 0, None, nf()).unwrap();
    assert_eq!(c, 0, "lowest free CI id");
    // 3g GI offers 1c, 2c, 3c only.
    let gp3 = m.gi_profile_by_id(9).unwrap();
    let ids: Vec<u32> = model::ci_profiles(m, gp3).iter().map(|c| c.id).collect();
    assert_eq!(ids, vec![0, 1, 2]);
    let gp1 = m.gi_profile_by_id(19).unwrap();
    let one = model::ci_profiles(m, gp1);
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].name, "MIG 1g.10gb");
}

#[test]
fn mig_disabled_and_lost() {
    let mut s = st(A100_40GB);
    s.set_mig_mode(0, false).unwrap();
    assert_eq!(s.create_gi(0, 19, None, nf()), Err(Ret::NOT_SUPPORTED));
    assert_eq!(s.gi_remaining_capacity(0, 19), Err(Ret::NOT_SUPPORTED));
    s.set_mig_mode(0, true).unwrap();
    s.create_gi(0, 19, None, nf()).unwrap();
    assert_eq!(s.set_mig_mode(0, false), Err(Ret::IN_USE));
    s.gpus[0].lost = true;
    assert_eq!(s.create_gi(0, 19, None, nf()), Err(Ret::GPU_IS_LOST));
    assert_eq!(s.create_gi(1, 19, None, nf()), Err(Ret::INVALID_ARGUMENT));
}

#[test]
fn cc_mode_pending_mig_mode_and_holders() {
    // Confidential computing: no GPU instance, and MIG cannot be turned on.
    let mut s = st(H100_80GB);
    s.gpus[0].cc_mode = true;
    assert_eq!(s.create_gi(0, 19, None, nf()), Err(Ret::NOT_SUPPORTED));
    s.gpus[0].mig_mode = false;
    assert_eq!(s.set_mig_mode(0, true), Err(Ret::NOT_SUPPORTED));
    // A mode change that needs a reset stays pending until one.
    let mut s = st(A100_80GB);
    s.gpus[0].reset_required = true;
    assert_eq!(s.set_mig_mode(0, false), Ok(Ret::RESET_REQUIRED.0));
    assert!(s.gpus[0].mig_mode && !s.gpus[0].pending_mig_mode);
    assert!(s.create_gi(0, 19, None, nf()).is_ok(), "still in MIG mode");
    s.reset_gpu(0).unwrap();
    assert!(!s.gpus[0].mig_mode && s.gpus[0].gis.is_empty());
    assert_eq!(s.set_mig_mode(0, true), Ok(Ret::RESET_REQUIRED.0));
    s.reset_gpu(0).unwrap();
    assert!(s.gpus[0].mig_mode);
    // A held instance is in use until its holder lets go.
    let (gi, ser) = s.create_gi(0, 19, None, nf()).unwrap();
    let (ci, cser) = s.create_ci(0, gi, ser, 0, None, nf()).unwrap();
    assert_eq!(
        s.destroy_ci(0, gi, ser, ci, cser, nf(), true),
        Err(Ret::IN_USE)
    );
    s.destroy_ci(0, gi, ser, ci, cser, nf(), false).unwrap();
    assert_eq!(s.destroy_gi(0, gi, ser, nf(), true), Err(Ret::IN_USE));
    s.destroy_gi(0, gi, ser, nf(), false).unwrap();
}

#[test]
fn faults_consumed_in_order() {
    let mut s = st(H200_141GB);
    s.faults.gi_create = vec![Ret::UNKNOWN.0];
    s.faults.destroy_in_use = 1;
    let mut local = Faults {
        gi_create: vec![Ret::NO_PERMISSION.0],
        ..Faults::default()
    };
    let r = s.create_gi(
        0,
        19,
        None,
        FaultSources {
            local: Some(&mut local),
        },
    );
    assert_eq!(r, Err(Ret::NO_PERMISSION));
    assert_eq!(s.create_gi(0, 19, None, nf()), Err(Ret::UNKNOWN));
    // Bad arguments do not consume a fault.
    s.faults.ci_create = vec![Ret::INSUFFICIENT_RESOURCES.0];
    let (gi, ser) = s.create_gi(0, 19, None, nf()).unwrap();
    assert_eq!(
        s.create_ci(0, gi, ser, 6, None, nf()),
        Err(Ret::INVALID_ARGUMENT)
    );
    assert_eq!(
        s.create_ci(0, gi, ser, 0, None, nf()),
        Err(Ret::INSUFFICIENT_RESOURCES)
    );
    assert!(s.create_ci(0, gi, ser, 0, None, nf()).is_ok());
    let (gi2, ser2) = s.create_gi(0, 19, None, nf()).unwrap();
    assert_eq!(s.destroy_gi(0, gi2, ser2, nf(), false), Err(Ret::IN_USE));
    assert_eq!(s.destroy_gi(0, gi2, ser2, nf(), false), Ok(()));
    assert!(s.faults.is_empty());
}

#[test]
fn mig_minor_numbering() {
    assert_eq!(model::gi_access_minor(0, 0), 3);
    assert_eq!(model::ci_access_minor(0, 0, 0), 4);
    assert_eq!(model::ci_access_minor(0, 0, 7), 11);
    assert_eq!(model::gi_access_minor(0, 1), 12);
    assert_eq!(model::gi_access_minor(1, 0), 138);
    let t = model::mig_minors_text();
    assert!(t.starts_with("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n"));
    assert!(t.ends_with("gpu31/gi14/ci7/access 4322\n"));
    assert_eq!(t.lines().count(), 2 + 32 * 135);
}
