//! The node's intent log: one preallocated file of fixed-size slots in the state folder, each
//! holding the intents of one job (its journal as the prolog wrote it just before the first
//! layer acts), written in place and made durable with one `fdatasync`.
//!
//! Why: the intents must be on disk before anything they announce that outlives a restart is
//! made. A journal file of its own needs its data, its inode and its folder on disk (two
//! syncs, with a block allocated); a slot whose blocks already exist and whose file keeps its
//! size needs one sync, and its write can start before the prolog waits for it
//! ([`IntentLog::write_flushing`]). The journal files stay what everything reads; the log only
//! matters after a power loss, when a journal file written since the last sync may be gone or
//! empty: `tenancyctl reconcile` then restores the journals of an earlier boot from the log
//! ([`crate::JournalDir::recover_intents`]).
//!
//! Which slots are held is also kept in a map beside it (`intents.map`, one byte per slot, never
//! synced): a prolog finds a free slot from one small read, whatever the number of running
//! jobs, and checks only that slot's header. The map is a hint: a slot it calls free is checked
//! before it is taken, and when it calls every slot held it is rebuilt from the slots themselves
//! (releasing those a crash left) before the log grows.
//!
//! Every call is made under the node lock ([`crate::JournalDir::lock_node`]).

use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::OnceLock;

/// The log's file name in the state folder.
pub const FILE: &str = "intents";
/// The map of held slots beside it.
const MAP: &str = "intents.map";
/// One page: a slot is written, and flushed, as one block.
pub const SLOT_SIZE: usize = 4096;
/// Slots of a new log (256 KiB); it doubles when every slot is taken.
const FIRST_SLOTS: u32 = 64;
/// The most slots (64 MiB); past that the journal file itself is made durable.
const MAX_SLOTS: u32 = 16384;
const MAGIC: &[u8; 8] = b"TNCYINT1";
/// Magic, job id, boot id, payload length, SHA-256 of the three and the payload.
const HEADER: usize = 8 + 8 + 16 + 4 + 32;
/// The largest payload a slot holds.
pub const CAPACITY: usize = SLOT_SIZE - HEADER;

/// This boot of the kernel (`/proc/sys/kernel/random/boot_id`): records of an earlier boot are
/// what a power loss may have left unfinished. `None` when it cannot be read: the log is then
/// not used.
pub fn boot_id() -> Option<[u8; 16]> {
    static BOOT: OnceLock<Option<[u8; 16]>> = OnceLock::new();
    *BOOT
        .get_or_init(|| parse_boot_id(&fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?))
}

/// When this boot began, by the wall clock now (the boot clock runs through suspend, as the
/// wall clock does); from the vDSO, no system call.
pub fn booted_at() -> Option<chrono::DateTime<chrono::Utc>> {
    let since_boot = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let since_boot = chrono::Duration::new(since_boot.tv_sec, since_boot.tv_nsec as u32)?;
    chrono::Utc::now().checked_sub_signed(since_boot)
}

fn parse_boot_id(text: &str) -> Option<[u8; 16]> {
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    let mut id = [0u8; 16];
    hex::decode_to_slice(&hex, &mut id).ok()?;
    Some(id)
}

/// What a slot holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// Never written, released, or a write a power loss tore (its job made nothing: the
    /// prolog acts only after the write is on disk).
    Free,
    Held(Record),
}

/// One job's intents in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub slot: u32,
    pub job_id: u64,
    pub boot: [u8; 16],
    /// The journal's bytes (JSON) when its intents were recorded.
    pub payload: Vec<u8>,
}

fn digest(job_id: u64, boot: &[u8; 16], payload: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(job_id.to_le_bytes());
    h.update(boot);
    h.update((payload.len() as u32).to_le_bytes());
    h.update(payload);
    h.finalize().into()
}

fn decode(slot: u32, bytes: &[u8]) -> Slot {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Slot::Free;
    }
    let job_id = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    let boot: [u8; 16] = bytes[16..32].try_into().unwrap();
    let len = u32::from_le_bytes(bytes[32..36].try_into().unwrap()) as usize;
    let Some(payload) = bytes.get(HEADER..HEADER + len) else {
        return Slot::Free;
    };
    if bytes[36..HEADER] != digest(job_id, &boot, payload) {
        return Slot::Free;
    }
    Slot::Held(Record {
        slot,
        job_id,
        boot,
        payload: payload.to_vec(),
    })
}

/// Intents written and on their way to the disk ([`IntentLog::write_flushing`]).
#[must_use = "the intents are on disk only once `wait` returns"]
pub struct Flushing {
    file: Option<File>,
}

impl Flushing {
    /// Intents that are on disk already (written with a sync).
    pub fn done() -> Flushing {
        Flushing { file: None }
    }

    /// Whether the intents may not be on disk yet.
    pub fn is_pending(&self) -> bool {
        self.file.is_some()
    }

    /// Returns once the intents are on disk; at once when they were already.
    pub fn wait(&mut self) -> io::Result<()> {
        match self.file.take() {
            Some(f) => f.sync_data(),
            None => Ok(()),
        }
    }
}

/// The open log.
pub struct IntentLog {
    file: File,
    map: File,
    slots: u32,
}

fn open_rw(path: &Path, create: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

impl IntentLog {
    /// Opens the log in `dir`, or `None` when there is none yet.
    pub fn open_existing(dir: &Path) -> io::Result<Option<IntentLog>> {
        match open_rw(&dir.join(FILE), false) {
            Ok(file) => {
                let slots = (file.metadata()?.len() / SLOT_SIZE as u64).min(MAX_SLOTS as u64);
                Ok(Some(IntentLog {
                    file,
                    map: open_rw(&dir.join(MAP), true)?,
                    slots: slots as u32,
                }))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the log in `dir`, creating it (zeroed, on disk with its name) when missing.
    pub fn open(dir: &Path) -> io::Result<IntentLog> {
        if let Some(log) = Self::open_existing(dir)? {
            return Ok(log);
        }
        // Made under another name and renamed, so the log is never seen half made.
        let tmp = dir.join(format!(".{FILE}.tmp"));
        let file = open_rw(&tmp, true)?;
        file.set_len(0)?;
        let map = open_rw(&dir.join(MAP), true)?;
        map.set_len(0)?;
        let mut log = IntentLog {
            file,
            map,
            slots: 0,
        };
        log.grow(FIRST_SLOTS)?;
        fs::rename(&tmp, dir.join(FILE))?;
        File::open(dir)?.sync_all()?;
        Ok(log)
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Extends the log to `slots` with zeroed blocks (written, not fallocated: a write into an
    /// unwritten extent would change metadata again) and waits until they are on disk.
    fn grow(&mut self, slots: u32) -> io::Result<()> {
        let zeros = vec![0u8; 64 * SLOT_SIZE];
        let mut at = self.slots as u64 * SLOT_SIZE as u64;
        let end = slots as u64 * SLOT_SIZE as u64;
        while at < end {
            let n = (end - at).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        self.file.sync_data()?;
        // The new slots are free.
        self.map.set_len(slots as u64)?;
        self.slots = slots;
        Ok(())
    }

    /// The map of held slots (1 held, 0 free), rebuilt when it is shorter than the log (lost,
    /// or made by an older build).
    fn read_map(&self) -> io::Result<Vec<u8>> {
        let mut map = vec![0u8; self.slots as usize];
        let mut got = 0;
        while got < map.len() {
            match self.map.read_at(&mut map[got..], got as u64)? {
                0 => break,
                n => got += n,
            }
        }
        if got < map.len() {
            return self.rebuild_map(|_| false);
        }
        Ok(map)
    }

    /// Marks every slot holding a record as held, but those `stale` says may be reused.
    fn rebuild_map(&self, stale: impl Fn(&Record) -> bool) -> io::Result<Vec<u8>> {
        let mut map = vec![0u8; self.slots as usize];
        for r in self.records()? {
            map[r.slot as usize] = u8::from(!stale(&r));
        }
        self.map.write_all_at(&map, 0)?;
        self.map.set_len(map.len() as u64)?;
        Ok(map)
    }

    fn mark(&self, slot: u32, held: bool) -> io::Result<()> {
        self.map.write_all_at(&[u8::from(held)], slot as u64)
    }

    /// The job a slot's header names, if any (its digest is not checked).
    fn header_job(&self, slot: u32) -> io::Result<Option<u64>> {
        let mut head = [0u8; 16];
        self.file
            .read_exact_at(&mut head, slot as u64 * SLOT_SIZE as u64)?;
        Ok((&head[..8] == MAGIC).then(|| u64::from_le_bytes(head[8..16].try_into().unwrap())))
    }

    /// What slot `slot` holds.
    #[cfg(test)]
    fn read(&self, slot: u32) -> io::Result<Slot> {
        let mut buf = vec![0u8; SLOT_SIZE];
        self.file
            .read_exact_at(&mut buf, slot as u64 * SLOT_SIZE as u64)?;
        Ok(decode(slot, &buf))
    }

    /// Every record in the log, in slot order.
    pub fn records(&self) -> io::Result<Vec<Record>> {
        // Read 256 slots (1 MiB) at a time: a full log is 64 MiB.
        const CHUNK: u32 = 256;
        let mut out = Vec::new();
        let mut buf = vec![0u8; CHUNK as usize * SLOT_SIZE];
        for first in (0..self.slots).step_by(CHUNK as usize) {
            let n = CHUNK.min(self.slots - first);
            let buf = &mut buf[..n as usize * SLOT_SIZE];
            self.file
                .read_exact_at(buf, first as u64 * SLOT_SIZE as u64)?;
            for (k, bytes) in buf.chunks(SLOT_SIZE).enumerate() {
                if let Slot::Held(r) = decode(first + k as u32, bytes) {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    /// A free slot: the lowest the map calls free whose header holds no record (the slot the
    /// last epilog released is then most often the one taken next, and the page that release
    /// left unsynced is the page this job's write syncs anyway: one block per flush, not two).
    /// When the map calls every slot held it is rebuilt from the slots, where a torn record,
    /// or one `stale` says may be reused (its job left no journal), is free; when none is, the
    /// log doubles. `None` when the log is at its largest and full.
    pub fn claim(&mut self, stale: impl Fn(&Record) -> bool) -> io::Result<Option<u32>> {
        if self.slots > 0 {
            let mut map = self.read_map()?;
            for rebuilt in [false, true] {
                if rebuilt {
                    map = self.rebuild_map(&stale)?;
                }
                for slot in 0..self.slots {
                    if map[slot as usize] != 0 {
                        continue;
                    }
                    if rebuilt || self.header_job(slot)?.is_none() {
                        return Ok(Some(slot));
                    }
                    // The map was behind: note it and look on.
                    self.mark(slot, true)?;
                }
            }
        }
        if self.slots >= MAX_SLOTS {
            return Ok(None);
        }
        let first_new = self.slots;
        self.grow((self.slots * 2).clamp(FIRST_SLOTS, MAX_SLOTS))?;
        Ok(Some(first_new))
    }

    /// Writes `job_id`'s intents (`payload`, at most [`CAPACITY`] bytes) into `slot` and waits
    /// until they are on disk: the blocks exist and the size stays, so no block is allocated.
    pub fn write(&self, slot: u32, job_id: u64, boot: &[u8; 16], payload: &[u8]) -> io::Result<()> {
        self.put(slot, job_id, boot, payload)?;
        self.file.sync_data()?;
        self.mark(slot, true)
    }

    /// [`Self::write`] that returns once the record is in the page cache (every process reads
    /// it from there) and its write to the disk has started; [`Flushing::wait`] waits until it
    /// is on disk. The prolog acts on the layers whose resources a restart removes while the
    /// write is under way, and waits before the first whose resource outlives one (see
    /// `Spine::make_all`).
    pub fn write_flushing(
        self,
        slot: u32,
        job_id: u64,
        boot: &[u8; 16],
        payload: &[u8],
    ) -> io::Result<Flushing> {
        self.put(slot, job_id, boot, payload)?;
        // Starts the write-back of the slot's page without waiting (the flush that follows
        // then finds the data written); a hint: fdatasync in `wait` writes it anyway.
        // SAFETY: a plain system call on an open descriptor; no memory is passed.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                slot as i64 * SLOT_SIZE as i64,
                SLOT_SIZE as i64,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.mark(slot, true)?;
        Ok(Flushing {
            file: Some(self.file),
        })
    }

    /// Writes the record of `job_id` into `slot` (not synced).
    fn put(&self, slot: u32, job_id: u64, boot: &[u8; 16], payload: &[u8]) -> io::Result<()> {
        if payload.len() > CAPACITY || slot >= self.slots {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} bytes do not fit slot {slot} of {} ({CAPACITY} bytes each)",
                    payload.len(),
                    self.slots
                ),
            ));
        }
        let mut buf = Vec::with_capacity(HEADER + payload.len());
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&job_id.to_le_bytes());
        buf.extend_from_slice(boot);
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        buf.extend_from_slice(&digest(job_id, boot, payload));
        buf.extend_from_slice(payload);
        self.file.write_all_at(&buf, slot as u64 * SLOT_SIZE as u64)
    }

    /// Frees `slot` when it holds `job_id`: not synced, as a release a power loss undoes
    /// only makes reconcile undo that job once more (every undo is idempotent).
    pub fn release(&self, slot: u32, job_id: u64) -> io::Result<()> {
        if slot < self.slots {
            release_slot(&self.file, Some(&self.map), slot, job_id)?;
        }
        Ok(())
    }

    /// [`Self::release`] in the log in `dir` (gone is fine), opening only what it writes: the
    /// epilog's way.
    pub fn release_in(dir: &Path, slot: u32, job_id: u64) -> io::Result<()> {
        let file = match open_rw(&dir.join(FILE), false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let map = match open_rw(&dir.join(MAP), false) {
            Ok(m) => Some(m),
            // Rebuilt from the slots when next read.
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        release_slot(&file, map.as_ref(), slot, job_id)
    }
}

/// Clears `slot`'s header and its byte in `map` when the header names `job_id`; a slot past
/// the end of the log holds nothing.
fn release_slot(file: &File, map: Option<&File>, slot: u32, job_id: u64) -> io::Result<()> {
    let at = slot as u64 * SLOT_SIZE as u64;
    let mut head = [0u8; 16];
    match file.read_exact_at(&mut head, at) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
        r => r?,
    }
    if &head[..8] != MAGIC || head[8..16] != job_id.to_le_bytes() {
        return Ok(());
    }
    file.write_all_at(&[0u8; HEADER], at)?;
    match map {
        Some(map) => map.write_all_at(&[0], slot as u64),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: [u8; 16] = [7; 16];
    const EARLIER: [u8; 16] = [1; 16];

    #[test]
    fn boot_id_is_read_and_parsed() {
        assert_eq!(
            parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n"),
            Some([
                0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2,
                0xe1, 0xf0
            ])
        );
        assert_eq!(parse_boot_id("not an id"), None);
        assert!(boot_id().is_some(), "this kernel has a boot id");
    }

    #[test]
    fn records_are_written_found_and_released() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = IntentLog::open(tmp.path()).unwrap();
        assert_eq!(log.slots(), FIRST_SLOTS);
        assert_eq!(
            fs::metadata(tmp.path().join(FILE)).unwrap().len(),
            FIRST_SLOTS as u64 * SLOT_SIZE as u64
        );
        let slot = log.claim(|_| false).unwrap().unwrap();
        assert_eq!(slot, 0);
        log.write(slot, 70, &BOOT, b"{\"job_id\":70}").unwrap();
        // Another process (a new open) sees it.
        let log2 = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        let recs = log2.records().unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(
            (recs[0].slot, recs[0].job_id, recs[0].boot),
            (slot, 70, BOOT)
        );
        assert_eq!(recs[0].payload, b"{\"job_id\":70}");
        // The next job takes the next slot; a released one is taken first.
        assert_eq!(log.claim(|_| false).unwrap(), Some(slot + 1));
        // Releasing another job's slot does nothing; the owner's frees it.
        log.release(slot, 71).unwrap();
        assert_eq!(log.records().unwrap().len(), 1);
        log.release(slot, 70).unwrap();
        assert!(log.records().unwrap().is_empty());
        assert_eq!(log.read(slot).unwrap(), Slot::Free);
        assert_eq!(log.claim(|_| false).unwrap(), Some(slot));
        log.write(1, 71, &BOOT, b"{}").unwrap();
        log.release(0, 70).unwrap();
        assert_eq!(log.claim(|_| false).unwrap(), Some(0));
    }

    #[test]
    fn a_record_on_its_way_to_the_disk_is_read_by_everyone_and_held() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = IntentLog::open(tmp.path()).unwrap();
        let slot = log.claim(|_| false).unwrap().unwrap();
        let mut flushing = log
            .write_flushing(slot, 80, &BOOT, b"{\"job_id\":80}")
            .unwrap();
        assert!(flushing.is_pending());
        // Before the wait, a new open (another process) reads it and the slot is held.
        let mut log2 = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        let recs = log2.records().unwrap();
        assert_eq!((recs.len(), recs[0].slot, recs[0].job_id), (1, slot, 80));
        assert_eq!(log2.claim(|_| false).unwrap(), Some(slot + 1));
        flushing.wait().unwrap();
        assert!(!flushing.is_pending());
        flushing.wait().unwrap();
        assert!(!Flushing::done().is_pending());
        // A payload too large is refused before anything is written.
        let mut log3 = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        let next = log3.claim(|_| false).unwrap().unwrap();
        let big = vec![b'x'; CAPACITY + 1];
        assert!(log3.write_flushing(next, 81, &BOOT, &big).is_err());
        assert_eq!(log2.records().unwrap().len(), 1);
    }

    #[test]
    fn records_are_found_across_read_chunks() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = IntentLog::open(tmp.path()).unwrap();
        log.grow(600).unwrap();
        for slot in [0, 255, 256, 599] {
            log.write(slot, slot as u64 + 1, &BOOT, b"{}").unwrap();
        }
        let found: Vec<(u32, u64)> = log
            .records()
            .unwrap()
            .iter()
            .map(|r| (r.slot, r.job_id))
            .collect();
        assert_eq!(found, [(0, 1), (255, 256), (256, 257), (599, 600)]);
    }

    #[test]
    fn a_lost_map_is_rebuilt_from_the_slots() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = IntentLog::open(tmp.path()).unwrap();
        for job in [3, 4] {
            let slot = log.claim(|_| false).unwrap().unwrap();
            log.write(slot, job, &BOOT, b"{}").unwrap();
        }
        drop(log);
        fs::remove_file(tmp.path().join(MAP)).unwrap();
        let mut log = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        assert_eq!(log.claim(|_| false).unwrap(), Some(2));
        // A map that calls a held slot free is corrected by the slot's header.
        log.write(2, 5, &BOOT, b"{}").unwrap();
        log.map.write_all_at(&[0], 2).unwrap();
        assert_eq!(log.claim(|_| false).unwrap(), Some(3));
        assert_eq!(log.read_map().unwrap()[..4], [1, 1, 1, 0]);
    }

    #[test]
    fn a_full_map_is_rebuilt_freeing_torn_and_stale_records_then_the_log_doubles() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = IntentLog::open(tmp.path()).unwrap();
        for job in 0..FIRST_SLOTS as u64 {
            let slot = log.claim(|_| false).unwrap().unwrap();
            assert_eq!(slot as u64, job);
            log.write(slot, job, if job == 9 { &EARLIER } else { &BOOT }, b"{}")
                .unwrap();
        }
        // Slot 5's job left no journal (the caller says so); slot 7 was torn by a power loss;
        // slot 9 is of an earlier boot (kept: `stale` does not free it).
        let stale = |r: &Record| r.job_id == 5 || r.job_id == 9 && r.boot == BOOT;
        assert_eq!(log.claim(stale).unwrap(), Some(5));
        log.write(5, 100, &BOOT, b"{}").unwrap();
        let at = 7 * SLOT_SIZE as u64 + HEADER as u64;
        log.file.write_all_at(b"[", at).unwrap();
        assert_eq!(log.read(7).unwrap(), Slot::Free);
        assert_eq!(log.claim(stale).unwrap(), Some(7));
        log.write(7, 101, &BOOT, b"{}").unwrap();
        // Now every slot is held: the log doubles.
        let slot = log.claim(stale).unwrap().unwrap();
        assert_eq!(slot, FIRST_SLOTS);
        assert_eq!(log.slots(), 2 * FIRST_SLOTS);
        assert_eq!(log.records().unwrap().len(), FIRST_SLOTS as usize);
        let big = vec![b' '; CAPACITY + 1];
        assert!(log.write(slot, 1000, &BOOT, &big).is_err());
        log.write(slot, 1000, &BOOT, &big[..CAPACITY]).unwrap();
        assert_eq!(log.records().unwrap().len(), FIRST_SLOTS as usize + 1);
        assert_eq!(log.claim(stale).unwrap(), Some(FIRST_SLOTS + 1));
    }
}
