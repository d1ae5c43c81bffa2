//! The per-job journal: what each layer intends to make, recorded before it is made, and what it
//! made, recorded after. Teardown (epilog, reconcile) works from the journal alone, so every
//! intent holds everything needed to find and undo its resource even if the config changed.
//!
//! Writes are atomic: a temporary file, then a rename over the journal (an exchange, so the old
//! file can be recycled). Intents, which must be on disk before anything they announce is made,
//! are also written into the node's intent log and synced there ([`crate::intent_log`]: one
//! write and one flush; the journal file itself is fsynced with its folder only when the log
//! cannot take them); the final result is not synced (every layer undoes from its intent alone).

mod model;
mod occupancy;
mod store;

pub use model::{Journal, Step, StepState, VERSION};
pub use occupancy::Occupant;
pub use store::{JournalDir, NodeLock, Unreadable};

#[cfg(test)]
#[allow(unused_imports)]
use {
    crate::intent_log::{self, IntentLog},
    chrono::Utc,
    occupancy::{fold_occupancy, group_occupancy, COMPACT_STEP, OCCUPANCY},
    serde_json::Value,
    std::fs,
    std::io,
    std::path::{Path, PathBuf},
    store::{MAX_SPARES, SPARES},
};

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(job_id: u64) -> Journal {
        Journal {
            version: VERSION,
            job_id,
            cluster: "c".into(),
            node: "n".into(),
            user: "u".into(),
            uid: 1,
            gid: 1,
            tenant: "acme".into(),
            tier: "internal".into(),
            profile: None,
            share_gpu: true,
            share_node: true,
            started: Utc::now(),
            steps: vec![Step {
                layer: "scratch".into(),
                state: StepState::Intended,
                intent: serde_json::json!({"path": "/x"}),
                made: None,
            }],
            intent_slot: None,
            boot_id: None,
        }
    }

    #[test]
    fn save_load_remove_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(&tmp.path().join("state")).unwrap();
        assert_eq!(dir.load(7).unwrap(), None);
        let j = sample(7);
        dir.save(&j, true).unwrap();
        dir.save(&sample(8), true).unwrap();
        assert_eq!(dir.load(7).unwrap(), Some(j));
        assert_eq!(dir.job_ids().unwrap(), vec![7, 8]);
        assert_eq!(dir.others(7).unwrap().len(), 1);
        dir.remove(&sample(7)).unwrap();
        dir.remove(&sample(7)).unwrap();
        assert_eq!(dir.job_ids().unwrap(), vec![8]);
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(names.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")));
    }

    #[test]
    fn occupancy_index_follows_jobs_and_is_rebuilt_when_lost() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut a = sample(1);
        a.steps = vec![Step {
            layer: "mig".into(),
            state: StepState::Made,
            intent: serde_json::json!({"gpu_uuid": "GPU-a"}),
            made: Some(serde_json::json!({"gpu_uuid": "GPU-a", "gi_id": 7})),
        }];
        dir.save(&a, true).unwrap();
        // No index yet: rebuilt from the journals.
        let occ = dir.occupants(99).unwrap();
        assert_eq!(occ, vec![Occupant::of(&a)]);
        assert_eq!(occ[0].gpu_uuid.as_deref(), Some("GPU-a"));
        let b = sample(2);
        dir.save(&b, true).unwrap();
        dir.set_occupant(2, Some(Occupant::of(&b))).unwrap();
        let ids: Vec<u64> = dir
            .occupants(99)
            .unwrap()
            .iter()
            .map(|o| o.job_id)
            .collect();
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(
            dir.occupants(1).unwrap().len(),
            1,
            "a job does not see itself"
        );
        dir.set_occupant(1, None).unwrap();
        assert_eq!(dir.occupants(99).unwrap(), vec![Occupant::of(&b)]);
        // A damaged index is rebuilt from the journals (both still exist).
        fs::write(dir.path().join(OCCUPANCY), b"+ 1 acme\n").unwrap();
        assert_eq!(dir.occupants(99).unwrap().len(), 2);
        // Appends are compacted once tombstones dominate: the file stays O(live jobs).
        for _ in 0..2000 {
            dir.set_occupant(3, Some(Occupant::of(&sample(3)))).unwrap();
            dir.set_occupant(3, None).unwrap();
        }
        let len = fs::metadata(dir.path().join(OCCUPANCY)).unwrap().len();
        assert!(len < 2 * COMPACT_STEP, "{len} bytes for 2 live jobs");
        assert_eq!(dir.occupants(99).unwrap().len(), 2);
        // The index is not mistaken for a journal.
        assert_eq!(dir.job_ids().unwrap(), vec![1, 2]);
    }

    #[test]
    fn occupants_are_grouped_by_description_so_placement_reads_few_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        fs::write(dir.path().join(OCCUPANCY), b"").unwrap();
        for job in 10..1010 {
            dir.set_occupant(job, Some(Occupant::of(&sample(job))))
                .unwrap();
        }
        let mut other = sample(5000);
        other.tenant = "globex".into();
        other.share_node = false;
        dir.set_occupant(5000, Some(Occupant::of(&other))).unwrap();
        dir.set_occupant(10, None).unwrap();
        let occ = dir.occupants(11).unwrap();
        assert_eq!(occ.len(), 2, "{occ:?}");
        assert_eq!((occ[0].job_id, occ[0].jobs), (12, 998));
        assert_eq!(occ[0].tenant, "acme");
        assert_eq!((occ[1].job_id, occ[1].jobs), (5000, 1));
        assert!(!occ[1].share_node);
        // An empty index is a node without jobs, not a damaged one: nothing is rebuilt.
        let empty = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(empty.path()).unwrap();
        dir.save(&sample(1), true).unwrap();
        fs::write(dir.path().join(OCCUPANCY), b"").unwrap();
        assert_eq!(dir.occupants(99).unwrap(), vec![]);
    }

    #[test]
    fn ended_journals_are_recycled_as_spares_and_overwritten_whole() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let spares = || -> Vec<u64> {
            let mut v: Vec<u64> = fs::read_dir(tmp.path().join(SPARES))
                .map(|rd| rd.map(|e| e.unwrap().metadata().unwrap().ino()).collect())
                .unwrap_or_default();
            v.sort_unstable();
            v
        };
        // A long journal ends: its file waits as a spare.
        let mut long = sample(1);
        long.user = "u".repeat(5000);
        dir.save(&long, true).unwrap();
        dir.remove(&long).unwrap();
        assert_eq!(dir.load(1).unwrap(), None);
        let kept = spares();
        assert_eq!(kept.len(), 1);
        // The next journal is written into it, cut to its own length.
        let short = sample(2);
        dir.save(&short, true).unwrap();
        assert_eq!(fs::metadata(dir.journal_path(2)).unwrap().ino(), kept[0]);
        assert_eq!(dir.load(2).unwrap(), Some(short.clone()));
        // Replacing it keeps the replaced file as a spare; the result reads back whole.
        let mut done = short.clone();
        done.steps[0].state = StepState::Made;
        dir.save(&done, false).unwrap();
        assert_eq!(dir.load(2).unwrap(), Some(done));
        assert_eq!(spares(), kept);
        // The pool is bounded; the rest is unlinked.
        for job in 10..40 {
            dir.save(&sample(job), true).unwrap();
        }
        for job in 10..40 {
            dir.remove(&sample(job)).unwrap();
        }
        assert_eq!(spares().len(), MAX_SPARES);
        assert_eq!(dir.job_ids().unwrap(), vec![2]);
    }

    #[test]
    fn intents_go_to_the_intent_log_and_leave_it_with_the_journal() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut j = sample(70);
        dir.save_intents(&mut j).unwrap().wait().unwrap();
        let slot = j.intent_slot.expect("a slot");
        assert_eq!(dir.load(70).unwrap(), Some(j.clone()));
        let log = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        let recs = log.records().unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!((recs[0].slot, recs[0].job_id), (slot, 70));
        assert_eq!(recs[0].boot, intent_log::boot_id().unwrap());
        let logged: Journal = serde_json::from_slice(&recs[0].payload).unwrap();
        assert_eq!(logged, j);
        // A later, larger result does not touch the log.
        let mut done = j.clone();
        done.steps[0].state = StepState::Made;
        done.steps[0].made = Some(serde_json::json!({"path": "/x", "uid": 1}));
        dir.save(&done, false).unwrap();
        assert_eq!(log.records().unwrap(), recs);
        // The job ends: the slot is free, the journal gone.
        dir.remove(&done).unwrap();
        assert!(log.records().unwrap().is_empty());
        assert_eq!(dir.load(70).unwrap(), None);
    }

    #[test]
    fn a_journal_too_large_for_a_slot_is_made_durable_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut j = sample(5);
        j.user = "u".repeat(intent_log::CAPACITY);
        dir.save_intents(&mut j).unwrap().wait().unwrap();
        assert_eq!(j.intent_slot, None);
        assert_eq!(dir.load(5).unwrap(), Some(j));
        let log = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        assert!(log.records().unwrap().is_empty());
    }

    #[test]
    fn a_slot_whose_job_left_no_journal_is_taken_again_before_the_log_grows() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let size = || {
            fs::metadata(tmp.path().join(intent_log::FILE))
                .unwrap()
                .len()
        };
        let mut slots = Vec::new();
        for job in 0..64 {
            let mut j = sample(job);
            dir.save_intents(&mut j).unwrap().wait().unwrap();
            slots.push(j.intent_slot.unwrap());
        }
        let full = size();
        // Job 3's journal went without its slot (a crash between the two).
        fs::remove_file(dir.journal_path(3)).unwrap();
        let mut next = sample(200);
        dir.save_intents(&mut next).unwrap().wait().unwrap();
        assert_eq!(next.intent_slot, Some(slots[3]));
        assert_eq!(size(), full);
        // Live jobs' slots are not: the log grows.
        let mut more = sample(201);
        dir.save_intents(&mut more).unwrap().wait().unwrap();
        assert!(!slots.contains(&more.intent_slot.unwrap()));
        assert_eq!(size(), 2 * full);
    }

    #[test]
    fn after_a_restart_journals_are_restored_from_the_intent_log() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let earlier = [0xee; 16];
        let mut log = IntentLog::open(tmp.path()).unwrap();
        let mut put = |j: &mut Journal| {
            let slot = log.claim(|_| false).unwrap().unwrap();
            j.intent_slot = Some(slot);
            log.write(slot, j.job_id, &earlier, &serde_json::to_vec(&*j).unwrap())
                .unwrap();
        };
        // 1: the journal file is gone; 2: it is empty (written, never synced); 3: it holds the
        // same attempt, further on; 4: an older attempt of the same job.
        let mut lost = sample(1);
        put(&mut lost);
        let mut empty = sample(2);
        put(&mut empty);
        fs::write(dir.journal_path(2), b"").unwrap();
        let mut kept = sample(3);
        put(&mut kept);
        let mut further = kept.clone();
        further.steps[0].state = StepState::Made;
        dir.save(&further, false).unwrap();
        let mut newer = sample(4);
        let mut older = newer.clone();
        older.started -= chrono::Duration::seconds(60);
        dir.save(&older, false).unwrap();
        put(&mut newer);
        // This boot's record of a live job stays.
        let mut live = sample(5);
        dir.save_intents(&mut live).unwrap().wait().unwrap();
        // 6: the job was requeued onto this node since the restart: its journal (this boot's)
        // stays, the dead attempt's record only goes.
        let mut dead = sample(6);
        put(&mut dead);
        let mut requeued = sample(6);
        requeued.started = dead.started + chrono::Duration::seconds(90);
        requeued.boot_id = intent_log::boot_id().map(hex::encode);
        dir.save(&requeued, false).unwrap();

        // A dry run says what it would restore and changes nothing.
        let (found, bad) = dir.recover_intents(false).unwrap();
        assert!(bad.is_empty());
        assert_eq!(found, vec![lost.clone(), empty.clone(), newer.clone()]);
        assert_eq!(dir.load(1).unwrap(), None);
        let log = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        assert_eq!(log.records().unwrap().len(), 6);

        let (found, _) = dir.recover_intents(true).unwrap();
        assert_eq!(found, vec![lost.clone(), empty.clone(), newer.clone()]);
        assert_eq!(dir.load(1).unwrap(), Some(lost));
        assert_eq!(dir.load(2).unwrap(), Some(empty));
        assert_eq!(dir.load(3).unwrap(), Some(further));
        assert_eq!(dir.load(4).unwrap(), Some(newer));
        assert_eq!(dir.load(6).unwrap(), Some(requeued));
        // Only the live job's slot is still held; a second pass finds nothing.
        let recs = log.records().unwrap();
        assert_eq!(recs.iter().map(|r| r.job_id).collect::<Vec<_>>(), [5]);
        assert_eq!(dir.recover_intents(true).unwrap(), (vec![], vec![]));
    }

    #[test]
    fn a_journal_is_from_an_earlier_boot_when_it_names_another_boot_and_started_before_this_one() {
        let booted = intent_log::booted_at().unwrap();
        let now = hex::encode(intent_log::boot_id().unwrap());
        let mut j = sample(1);
        assert!(!j.from_earlier_boot(), "no boot named");
        j.started = booted - chrono::Duration::minutes(1);
        j.boot_id = Some(now);
        assert!(!j.from_earlier_boot(), "this boot");
        j.boot_id = Some("ee".repeat(16));
        assert!(j.from_earlier_boot());
        // Started well after this boot began: this boot's, whatever it names.
        j.started = booted + chrono::Duration::hours(2);
        assert!(!j.from_earlier_boot());
    }

    #[test]
    fn corrupt_journal_is_an_error_not_a_missing_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        fs::write(dir.journal_path(9), b"{not json").unwrap();
        assert!(dir.load(9).is_err());
    }

    #[test]
    fn load_refuses_another_jobs_journal_under_a_jobs_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        // A recycled spare, after a power loss, can hold an older journal of another job.
        fs::write(dir.journal_path(5), serde_json::to_vec(&sample(9)).unwrap()).unwrap();
        let e = dir.load(5).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let msg = e.to_string();
        assert!(
            msg.contains("job_5.json") && msg.contains("job 9") && msg.contains("job 5"),
            "{msg}"
        );
        // Every job's own journal under every job's name: placement reads refuse a mixed one.
        dir.save(&sample(6), false).unwrap();
        assert!(dir.others(6).is_err());
        assert!(dir.load_unlocked(5).is_err(), "retries end");
    }

    #[test]
    fn recovery_restores_the_intents_over_another_jobs_journal_under_the_jobs_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut log = IntentLog::open(tmp.path()).unwrap();
        let mut n = sample(5);
        let slot = log.claim(|_| false).unwrap().unwrap();
        n.intent_slot = Some(slot);
        log.write(slot, 5, &[0xee; 16], &serde_json::to_vec(&n).unwrap())
            .unwrap();
        // job_5.json holds job 9's journal, started later: without the id check it passed as
        // job 5's newer journal and job 5's intents were dropped.
        let mut m = sample(9);
        m.started = n.started + chrono::Duration::seconds(2);
        fs::write(dir.journal_path(5), serde_json::to_vec(&m).unwrap()).unwrap();
        let (found, _) = dir.recover_intents(true).unwrap();
        assert_eq!(found, vec![n.clone()]);
        assert_eq!(dir.load(5).unwrap(), Some(n));
    }

    #[test]
    fn an_unlocked_reader_retries_past_a_spare_being_recycled() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        fs::write(dir.journal_path(7), serde_json::to_vec(&sample(8)).unwrap()).unwrap();
        let own = tmp.path().join("own");
        fs::write(&own, serde_json::to_vec(&sample(7)).unwrap()).unwrap();
        let path = dir.journal_path(7);
        // The prolog that recycled the spare finishes its write while the reader pauses.
        let mut pauses = 0;
        let got = dir.load_retrying(7, 3, || {
            pauses += 1;
            if pauses == 1 {
                fs::rename(&own, &path).unwrap();
            }
        });
        assert_eq!(got.unwrap().unwrap().job_id, 7);
        assert_eq!(pauses, 1);
        // A file that stays foreign is an error after the retries, never another job's journal.
        fs::write(dir.journal_path(9), serde_json::to_vec(&sample(8)).unwrap()).unwrap();
        let e = dir.load_retrying(9, 3, || ()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
