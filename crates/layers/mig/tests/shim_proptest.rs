//! The Slurm/placement property, run through the real NVML path (nvml-shim): any
//! allocate/free sequence Slurm's per-slot GRES bookkeeping permits places without error,
//! and NVML's GIs always equal the slots Slurm holds.

mod common;
use common::{Scenario, TWO_H200};
use proptest::prelude::*;
use std::collections::BTreeMap;
use tenancy_mig::*;

fn arb_carving() -> impl Strategy<Value = Carving> {
    // "+me" profiles are left out here: nvml-shim (free_gi_placements) only accepts the
    // highest start for a profile whose instance count is below its placement count, so an
    // explicit 1g+me placement at 0..5 fails there (see `plus_me_at_any_start` below). The
    // pure-model proptest in src/tests.rs covers "+me".
    let names: Vec<&'static str> = GpuModel::H200_141GB
        .profiles()
        .iter()
        .map(|p| p.name)
        .filter(|n| !n.ends_with("+me"))
        .collect();
    proptest::collection::btree_map(proptest::sample::select(names), 1u32..3, 1..4)
        .prop_map(|m| {
            m.into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<Carving>()
        })
        .prop_filter("fits", |c| {
            let gpus = [PlanGpu {
                index: 0,
                minor: 0,
                model: GpuModel::H200_141GB,
            }];
            let plan = NodePlan {
                models: BTreeMap::new(),
                gpus: BTreeMap::from([("0".into(), c.clone())]),
            };
            plan_slots(&plan, &gpus).is_ok()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn slurm_permitted_sequences_place_through_nvml(
        c0 in arb_carving(),
        c1 in arb_carving(),
        ops in proptest::collection::vec((any::<bool>(), 0usize..64, 0usize..64), 1..24),
    ) {
        let Some(sc) = Scenario::new(TWO_H200, None) else { return Ok(()) };
        let mut mig = sc.open();
        let plan = NodePlan { models: BTreeMap::new(), gpus: BTreeMap::from([("0".into(), c0), ("1".into(), c1)]) };
        let slots = plan_slots(&plan, &mig.plan_gpus(true).unwrap()).unwrap();
        mig.set_plan(slots.clone());
        let mut busy = vec![false; slots.len()];
        let mut live: Vec<(usize, MigIntent, MigSlice)> = Vec::new();
        for (alloc, a, b) in ops {
            if alloc {
                let free: Vec<usize> = (0..slots.len()).filter(|&i| !busy[i]).collect();
                if free.is_empty() { continue; }
                // slurmctld picks any free slot (SLURM_JOB_GPUS); the prolog places it.
                let si = free[a % free.len()];
                let r = Request { profile: None, slot: Some(si as u32), tenant: format!("t{}", b % 3), share_gpu: true };
                let i = mig.choose(&r, &[]).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let m = mig.create(&i).map_err(|e| TestCaseError::fail(e.to_string()))?;
                busy[si] = true;
                live.push((si, i, m));
            } else if !live.is_empty() {
                let (si, i, m) = live.remove(a % live.len());
                let t = mig.destroy(&i, Some(&m)).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(t.gi, Outcome::Destroyed);
                busy[si] = false;
            }
            // NVML truth == Slurm's bookkeeping.
            let mut want: Vec<(u32, u32, u32)> = live.iter().map(|(si, _, _)| (slots[*si].gpu, slots[*si].start, slots[*si].size)).collect();
            let mut have: Vec<(u32, u32, u32)> = sc.gis().iter().map(|g| (g.0, g.2, g.3)).collect();
            want.sort();
            have.sort();
            prop_assert_eq!(want, have);
        }
    }
}

/// Real NVML places a 1g+me GI at any 1g start ({0..6}:1); the plan may put it anywhere.
#[test]
fn plus_me_at_any_start() {
    let Some(sc) = Scenario::new(TWO_H200, None) else {
        return;
    };
    let mig = sc.open();
    let g = &mig.gpus().unwrap()[0];
    let i = MigIntent {
        gpu_index: 0,
        gpu_uuid: g.uuid.clone(),
        profile: "1g.18gb+me".into(),
        gi_profile_id: 20,
        ci_profile_id: 0,
        placement_start: 0,
        placement_size: 1,
        slot: None,
    };
    let m = mig.create(&i).unwrap();
    mig.destroy(&i, Some(&m)).unwrap();
}
