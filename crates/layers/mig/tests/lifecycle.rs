//! Create / destroy through the real NVML code path (nvml-shim).

mod common;
use common::request::req;
use common::{Scenario, TWO_H200};
use tenancy_mig::*;

#[test]
fn gpus_are_listed() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mig = sc.open();
    let gpus = mig.gpus().unwrap();
    assert_eq!(gpus.len(), 2);
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(g.index, i as u32);
        assert!(g.uuid.starts_with("GPU-"), "{g:?}");
        assert!(g.mig_enabled);
        assert_eq!(g.model, Some(GpuModel::H200_141GB), "{g:?}");
    }
    assert_ne!(gpus[0].uuid, gpus[1].uuid);
    assert_eq!(mig.plan_gpus(true).unwrap().len(), 2);
}

#[test]
fn create_teardown_idempotent() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mig = sc.open();
    let intent = mig
        .choose(&req(Some("3g.71gb"), None, "acme", true), &[])
        .unwrap();
    assert_eq!((intent.gi_profile_id, intent.placement_size), (9, 4));
    // The intent survives a journal round trip.
    let intent: MigIntent = serde_json::from_str(&serde_json::to_string(&intent).unwrap()).unwrap();
    let slice = mig.create(&intent).unwrap();
    assert!(slice.mig_uuid.starts_with("MIG-"), "{slice:?}");
    assert_eq!(slice.gpu_uuid, intent.gpu_uuid);
    // The shim holds exactly that GI with one CI at the placement.
    assert_eq!(
        sc.gis(),
        vec![(intent.gpu_index, slice.gi_id, intent.placement_start, 4, 1)]
    );
    // instances() sees it too.
    let views = mig.instances().unwrap();
    let v = &views[intent.gpu_index as usize];
    assert_eq!(v.instances.len(), 1);
    assert_eq!(v.instances[0].gi_id, slice.gi_id);
    assert_eq!(v.instances[0].ci_ids, vec![slice.ci_id]);
    assert_eq!(
        (v.instances[0].start, v.instances[0].size),
        (intent.placement_start, 4)
    );

    let t = mig.destroy(&intent, Some(&slice)).unwrap();
    assert_eq!((t.ci, t.gi), (Outcome::Destroyed, Outcome::Destroyed));
    assert_eq!(t.ci_ids, vec![slice.ci_id]);
    assert!(sc.gis().is_empty());
    // Second teardown: already gone is not an error, and says so.
    let t2 = mig.destroy(&intent, Some(&slice)).unwrap();
    assert_eq!((t2.ci, t2.gi), (Outcome::AlreadyGone, Outcome::AlreadyGone));
    let t3 = mig.destroy(&intent, None).unwrap();
    assert_eq!(
        (t3.ci, t3.gi, t3.gi_id),
        (Outcome::AlreadyGone, Outcome::AlreadyGone, None)
    );
    // A new NVML session (the epilog is another process) sees the same.
    drop(mig);
    let mig = sc.open();
    assert_eq!(
        mig.destroy(&intent, Some(&slice)).unwrap().gi,
        Outcome::AlreadyGone
    );
}

#[test]
fn crash_recovery_destroy_without_slice() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mig = sc.open();
    let keep = mig
        .create(
            &mig.choose(&req(Some("1g.18gb"), None, "other", true), &[])
                .unwrap(),
        )
        .unwrap();
    let intent = mig
        .choose(&req(Some("2g.35gb"), None, "acme", true), &[])
        .unwrap();
    let made = mig.create(&intent).unwrap();
    // The prolog "crashed" before journaling `made`: the epilog has only the intent.
    drop(mig);
    let mig = sc.open();
    let t = mig.destroy(&intent, None).unwrap();
    assert_eq!(t.gi_id, Some(made.gi_id));
    assert_eq!((t.ci, t.gi), (Outcome::Destroyed, Outcome::Destroyed));
    // Only the other job's GI remains.
    let gis = sc.gis();
    assert_eq!(gis.len(), 1, "{gis:?}");
    assert_eq!(gis[0].1, keep.gi_id);
    assert_eq!(mig.destroy(&intent, None).unwrap().gi, Outcome::AlreadyGone);
}

#[test]
fn destroy_does_not_touch_a_reused_gi_id() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mig = sc.open();
    let a = mig
        .choose(&req(Some("7g.141gb"), None, "a", true), &[])
        .unwrap();
    let a_made = mig.create(&a).unwrap();
    mig.destroy(&a, Some(&a_made)).unwrap();
    // Another job now gets a GI, possibly with the same id, elsewhere.
    let b = Intent1g::on(&mig, a.gpu_index, 6);
    let b_made = mig.create(&b).unwrap();
    let t = mig.destroy(&a, Some(&a_made)).unwrap();
    assert_eq!(t.gi, Outcome::AlreadyGone);
    if b_made.gi_id == a_made.gi_id {
        assert!(
            t.note.as_deref().unwrap_or("").contains("left alone"),
            "{t:?}"
        );
    }
    assert_eq!(sc.gis().len(), 1, "the other job's GI must survive");
}

struct Intent1g;
impl Intent1g {
    fn on(mig: &Mig, gpu: u32, start: u32) -> MigIntent {
        let g = &mig.gpus().unwrap()[gpu as usize];
        MigIntent {
            gpu_index: gpu,
            gpu_uuid: g.uuid.clone(),
            profile: "1g.18gb".into(),
            gi_profile_id: 19,
            ci_profile_id: 0,
            placement_start: start,
            placement_size: 1,
            slot: None,
        }
    }
}

#[test]
fn choose_respects_slot_hints_and_occupied_placements() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mut mig = sc.open();
    let plan: NodePlan = serde_json::from_str(
        r#"{"models": {"H200-141GB": {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}}}"#,
    )
    .unwrap();
    let slots = plan_slots(&plan, &mig.plan_gpus(true).unwrap()).unwrap();
    mig.set_plan(slots.clone());
    // Every slot, taken by hint, lands exactly where the plan put it, all at once.
    let mut made = Vec::new();
    for s in &slots {
        let i = mig
            .choose(&req(None, Some(s.index), "acme", true), &[])
            .unwrap();
        assert_eq!(
            (
                i.gpu_index,
                i.placement_start,
                i.placement_size,
                i.profile.as_str()
            ),
            (s.gpu, s.start, s.size, s.profile.as_str())
        );
        made.push((i.clone(), mig.create(&i).unwrap()));
    }
    assert_eq!(sc.gis().len(), slots.len());
    // Both GPUs are now fully carved (7 compute slices each).
    // A slot whose placement is occupied (here: by its own still-live GI) is refused by name.
    let e = mig
        .choose(&req(None, Some(slots[0].index), "acme", true), &[])
        .unwrap_err();
    assert!(matches!(e, MigError::Occupied { .. }), "{e}");
    // Without hint: every slot of the profile is taken.
    let e = mig
        .choose(&req(Some("1g.18gb"), None, "acme", true), &[])
        .unwrap_err();
    assert!(matches!(e, MigError::NoPlacement { .. }), "{e}");
    // Free one 1g slot on GPU 1: first fit finds exactly it.
    let (i, m) = made
        .iter()
        .find(|(i, _)| i.gpu_index == 1 && i.profile == "1g.18gb")
        .unwrap();
    mig.destroy(i, Some(m)).unwrap();
    let again = mig
        .choose(&req(Some("1g.18gb"), None, "acme", true), &[])
        .unwrap();
    assert_eq!(
        (again.gpu_index, again.placement_start, again.slot),
        (i.gpu_index, i.placement_start, i.slot)
    );
    for (i, m) in &made {
        mig.destroy(i, Some(m)).unwrap();
    }
    assert!(sc.gis().is_empty());
}

#[test]
fn non_sharing_tenants_never_share_a_gpu() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mig = sc.open();
    let mut occupants: Vec<Occupant> = Vec::new();
    let mut live = Vec::new();
    // alice (no sharing) and bob (no sharing) each take slices; carol (sharing) too.
    for (tenant, share) in [
        ("alice", false),
        ("bob", false),
        ("alice", false),
        ("carol", true),
        ("bob", false),
    ] {
        let r = req(Some("1g.18gb"), None, tenant, share);
        match mig.choose(&r, &occupants) {
            Ok(i) => {
                let m = mig.create(&i).unwrap();
                occupants.push(Occupant {
                    gpu_uuid: i.gpu_uuid.clone(),
                    tenant: tenant.into(),
                    share_gpu: share,
                    jobs: 1,
                });
                live.push((tenant, i, m));
            }
            Err(e) => {
                // carol: both GPUs are held by non-sharing tenants.
                assert_eq!(tenant, "carol", "{e}");
                let s = e.to_string();
                assert!(matches!(e, MigError::Refused { .. }), "{s}");
                assert!(s.contains("alice") && s.contains("bob"), "{s}");
            }
        }
    }
    // Check NVML's truth: each GPU's GIs belong to one tenant.
    let views = mig.instances().unwrap();
    for v in &views {
        let tenants: std::collections::BTreeSet<&str> = live
            .iter()
            .filter(|(_, i, _)| i.gpu_uuid == v.uuid)
            .map(|(t, _, _)| *t)
            .collect();
        assert_eq!(
            v.instances.len(),
            live.iter().filter(|(_, i, _)| i.gpu_uuid == v.uuid).count()
        );
        assert_eq!(tenants.len(), 1, "GPU {} holds {tenants:?}", v.index);
    }
    assert_eq!(live.len(), 4);
    // bob is refused a third slice nowhere: his own GPU still has room.
    for (_, i, m) in &live {
        mig.destroy(i, Some(m)).unwrap();
    }
}

#[test]
fn destroy_gi_for_reconcile() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mig = sc.open();
    let i = mig
        .choose(&req(Some("4g.71gb"), None, "x", true), &[])
        .unwrap();
    let m = mig.create(&i).unwrap();
    let t = mig.destroy_gi(i.gpu_index, m.gi_id).unwrap();
    assert_eq!(
        (t.gi, t.ci_ids.clone()),
        (Outcome::Destroyed, vec![m.ci_id])
    );
    assert!(sc.gis().is_empty());
    assert_eq!(
        mig.destroy_gi(i.gpu_index, m.gi_id).unwrap().gi,
        Outcome::AlreadyGone
    );
}
