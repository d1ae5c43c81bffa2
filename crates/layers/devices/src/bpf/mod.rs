//! BPF_PROG_TYPE_CGROUP_DEVICE program generation (no compiler: a handful of instructions
//! emitted directly), a reference interpreter for exactly those instructions (tests, doctor
//! self-check), and the raw bpf(2) calls.

pub mod interp;
pub mod sys;

use crate::policy::{DevType, DevicePolicy};

/// One eBPF instruction, laid out as the kernel's `struct bpf_insn` (little endian: dst
/// register in the low nibble of `regs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    pub fn dst(&self) -> u8 {
        self.regs & 0x0f
    }
    pub fn src(&self) -> u8 {
        self.regs >> 4
    }
}

/// Opcodes used by the generator (and the only ones the interpreter accepts).
pub mod op {
    /// BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
    pub const LDXW: u8 = 0x61;
    /// BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
    pub const MOV64_IMM: u8 = 0xb7;
    /// BPF_ALU64 | BPF_MOV | BPF_X: dst = src
    pub const MOV64_REG: u8 = 0xbf;
    /// BPF_ALU64 | BPF_AND | BPF_K
    pub const AND64_IMM: u8 = 0x57;
    /// BPF_ALU64 | BPF_RSH | BPF_K
    pub const RSH64_IMM: u8 = 0x77;
    /// BPF_JMP | BPF_JA
    pub const JA: u8 = 0x05;
    /// BPF_JMP | BPF_JEQ | BPF_K
    pub const JEQ_IMM: u8 = 0x15;
    /// BPF_JMP | BPF_JNE | BPF_K
    pub const JNE_IMM: u8 = 0x55;
    /// BPF_JMP | BPF_JSET | BPF_K: if (dst & imm) goto
    pub const JSET_IMM: u8 = 0x45;
    /// BPF_JMP | BPF_EXIT
    pub const EXIT: u8 = 0x95;
}

/// `struct bpf_cgroup_dev_ctx` offsets.
pub const CTX_ACCESS_TYPE: i16 = 0;
pub const CTX_MAJOR: i16 = 4;
pub const CTX_MINOR: i16 = 8;
/// BPF_DEVCG_DEV_BLOCK / BPF_DEVCG_DEV_CHAR (low 16 bits of access_type).
pub const DEVCG_DEV_BLOCK: u32 = 1;
pub const DEVCG_DEV_CHAR: u32 = 2;

// Register use: r1 ctx, r2 access bits, r3 major, r4 minor, r5 device type.
const R_ACC: u8 = 2;
const R_MAJ: u8 = 3;
const R_MIN: u8 = 4;
const R_TYPE: u8 = 5;

#[derive(Clone, Copy)]
enum Target {
    Next(usize),
    Allow,
    Deny,
}

struct Asm {
    insns: Vec<Insn>,
    /// (instruction index, jump target) to patch.
    fix: Vec<(usize, Target)>,
    /// Position of each allow block's "next" label.
    next: Vec<usize>,
}

impl Asm {
    fn ins(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            regs: (src << 4) | (dst & 0xf),
            off,
            imm,
        });
    }
    fn jmp(&mut self, code: u8, dst: u8, imm: i32, t: Target) {
        self.fix.push((self.insns.len(), t));
        self.ins(code, dst, 0, 0, imm);
    }
}

/// A digest of the program `insns` (SHA-256 of the instructions as they lie in memory, 16
/// bytes): the key under which a loaded program is found again ([`crate::v2::Programs`]). The
/// kernel's own tag of a program is no substitute: how it is computed changed (SHA-1 until Linux
/// 6.17, SHA-256 since).
pub fn digest(insns: &[Insn]) -> [u8; 16] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for i in insns {
        h.update([i.code, i.regs]);
        h.update(i.off.to_ne_bytes());
        h.update(i.imm.to_ne_bytes());
    }
    let d = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Generate the device program for `policy`. Returns the instructions; the verdict for every
/// (type, major, minor, access) equals [`DevicePolicy::decide`] (checked by the unit tests
/// through [`interp::run`]).
pub fn generate(policy: &DevicePolicy) -> Vec<Insn> {
    let mut a = Asm {
        insns: Vec::new(),
        fix: Vec::new(),
        next: Vec::new(),
    };
    a.ins(op::LDXW, R_ACC, 1, CTX_ACCESS_TYPE, 0);
    a.ins(op::LDXW, R_MAJ, 1, CTX_MAJOR, 0);
    a.ins(op::LDXW, R_MIN, 1, CTX_MINOR, 0);
    a.ins(op::MOV64_REG, R_TYPE, R_ACC, 0, 0);
    a.ins(op::AND64_IMM, R_TYPE, 0, 0, 0xffff);
    a.ins(op::RSH64_IMM, R_ACC, 0, 0, 16);
    // Allow rules that matter (on a denied major; others are implied by the default allow).
    for c in policy.effective_allows() {
        let t = Target::Next(a.next.len());
        let dt = match c.dev_type {
            DevType::Char => DEVCG_DEV_CHAR,
            DevType::Block => DEVCG_DEV_BLOCK,
        };
        a.jmp(op::JNE_IMM, R_TYPE, dt as i32, t);
        if let Some(m) = c.major {
            a.jmp(op::JNE_IMM, R_MAJ, m as i32, t);
        }
        if let Some(m) = c.minor {
            a.jmp(op::JNE_IMM, R_MIN, m as i32, t);
        }
        let missing = !c.access.0 & 7;
        if missing != 0 {
            a.jmp(op::JSET_IMM, R_ACC, missing as i32, t);
        }
        a.jmp(op::JA, 0, 0, Target::Allow);
        // the "next" label of this block is here
        a.next.push(a.insns.len());
    }
    // Single denied devices (RDMA), after the allows that may open them.
    for d in &policy.deny_devices {
        let (Some(ma), Some(mi)) = (d.major, d.minor) else {
            continue;
        };
        let t = Target::Next(a.next.len());
        a.jmp(op::JNE_IMM, R_TYPE, DEVCG_DEV_CHAR as i32, t);
        a.jmp(op::JNE_IMM, R_MAJ, ma as i32, t);
        a.jmp(op::JNE_IMM, R_MIN, mi as i32, t);
        a.jmp(op::JA, 0, 0, Target::Deny);
        a.next.push(a.insns.len());
    }
    if !policy.deny_majors.is_empty() {
        a.jmp(op::JNE_IMM, R_TYPE, DEVCG_DEV_CHAR as i32, Target::Allow);
        for &m in &policy.deny_majors {
            a.jmp(op::JEQ_IMM, R_MAJ, m as i32, Target::Deny);
        }
    }
    let allow_at = a.insns.len();
    a.ins(op::MOV64_IMM, 0, 0, 0, 1);
    a.ins(op::EXIT, 0, 0, 0, 0);
    let deny_at = a.insns.len();
    // The verifier rejects unreachable code: emit the deny tail only when something jumps there.
    if a.fix.iter().any(|(_, t)| matches!(t, Target::Deny)) {
        a.ins(op::MOV64_IMM, 0, 0, 0, 0);
        a.ins(op::EXIT, 0, 0, 0, 0);
    }
    for &(i, t) in &a.fix {
        let dest = match t {
            Target::Next(k) => a.next[k],
            Target::Allow => allow_at,
            Target::Deny => deny_at,
        };
        let off = dest as i64 - i as i64 - 1;
        a.insns[i].off = i16::try_from(off).expect("device program too long");
    }
    a.insns
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::{driver, job_a};
    use crate::policy::{Access, SliceRef, Verdict};
    use proptest::prelude::*;

    fn verdict(prog: &[Insn], t: DevType, ma: u32, mi: u32, acc: Access) -> Verdict {
        let ty = match t {
            DevType::Char => DEVCG_DEV_CHAR,
            DevType::Block => DEVCG_DEV_BLOCK,
        };
        match interp::run(prog, (acc.0 as u32) << 16 | ty, ma, mi).unwrap() {
            1 => Verdict::Allow,
            0 => Verdict::Deny,
            r => panic!("program returned {r}"),
        }
    }

    #[test]
    fn table() {
        use DevType::*;
        use Verdict::*;
        let p = job_a();
        let prog = generate(&p);
        interp::validate(&prog).unwrap();
        let rw = Access::RW;
        let table: &[(DevType, u32, u32, Access, Verdict)] = &[
            (Char, 195, 255, rw, Allow),
            (Char, 195, 255, Access::RWM, Deny),
            (Char, 195, 255, Access::MKNOD, Deny),
            (Char, 195, 0, rw, Allow),
            (Char, 195, 0, Access::READ, Allow),
            (Char, 195, 1, rw, Deny),
            (Char, 195, 254, Access::READ, Allow),
            (Char, 195, 254, Access::WRITE, Deny),
            (Char, 237, 0, rw, Allow),
            (Char, 237, 1, rw, Allow),
            (Char, 237, 2, Access::READ, Deny),
            (Char, 235, 12, rw, Allow),
            (Char, 235, 13, rw, Allow),
            (Char, 235, 21, rw, Deny),
            (Char, 235, 22, rw, Deny),
            (Char, 235, 1, Access::READ, Deny),
            (Char, 235, 2, Access::READ, Deny),
            (Char, 235, 147, rw, Deny),
            (Char, 235, 148, rw, Deny),
            (Char, 234, 0, rw, Deny),
            (Char, 1, 3, Access::RWM, Allow),
            (Char, 136, 0, rw, Allow),
            (Char, 5, 2, rw, Allow),
            (Block, 195, 0, rw, Allow),
            (Block, 235, 12, Access::RWM, Allow),
            (Block, 8, 0, Access::RWM, Allow),
        ];
        for &(t, ma, mi, acc, v) in table {
            assert_eq!(verdict(&prog, t, ma, mi, acc), v, "{t:?} {ma}:{mi} {acc}");
            assert_eq!(p.decide(t, ma, mi, acc), v, "{t:?} {ma}:{mi} {acc}");
        }
    }

    /// RDMA devices are denied one by one, unless an extra class of the tier opens them: the
    /// program agrees with the reference decision on them and on their majors' neighbours.
    #[test]
    fn rdma_devices_are_denied_unless_allowed() {
        let drv = crate::driver::DriverInfo {
            rdma: [(231, 192), (231, 0), (10, 61)]
                .map(|(major, minor)| crate::driver::RdmaDevice {
                    path: "/dev/infiniband/x".into(),
                    major,
                    minor,
                })
                .into(),
            ..driver()
        };
        for extra in [vec![], vec!["c 231:192 rw".parse().unwrap()]] {
            let p = DevicePolicy::for_job(&drv, &[], &extra).unwrap();
            let prog = generate(&p);
            interp::validate(&prog).unwrap();
            for (ma, mi) in [(231, 192), (231, 0), (231, 1), (10, 61), (10, 62), (1, 3)] {
                for acc in [Access::READ, Access::RW, Access::RWM] {
                    assert_eq!(
                        verdict(&prog, DevType::Char, ma, mi, acc),
                        p.decide(DevType::Char, ma, mi, acc),
                        "{ma}:{mi} {acc} with {extra:?}"
                    );
                }
            }
            let verbs = p.decide(DevType::Char, 231, 192, Access::RW);
            assert_eq!(verbs == Verdict::Allow, !extra.is_empty());
            assert_eq!(p.decide(DevType::Char, 10, 61, Access::READ), Verdict::Deny);
            assert_eq!(
                p.decide(DevType::Char, 10, 62, Access::READ),
                Verdict::Allow
            );
        }
    }

    #[test]
    fn no_slice_program_denies_nvidia() {
        let p = DevicePolicy::for_job(&driver(), &[], &[]).unwrap();
        let prog = generate(&p);
        interp::validate(&prog).unwrap();
        assert_eq!(
            verdict(&prog, DevType::Char, 195, 255, Access::READ),
            Verdict::Deny
        );
        assert_eq!(
            verdict(&prog, DevType::Char, 1, 3, Access::READ),
            Verdict::Allow
        );
        // without any NVIDIA major: allow everything
        let p = DevicePolicy::for_job(&Default::default(), &[], &[]).unwrap();
        let prog = generate(&p);
        assert_eq!(prog.len(), 8); // 6 loads/shifts + allow tail, no unreachable deny tail
        assert_eq!(
            verdict(&prog, DevType::Char, 195, 0, Access::RWM),
            Verdict::Allow
        );
    }

    fn arb_policy() -> impl Strategy<Value = DevicePolicy> {
        let slices = proptest::sample::subsequence(
            vec![
                SliceRef {
                    gpu_minor: 0,
                    gi_id: 1,
                    ci_id: 0,
                },
                SliceRef {
                    gpu_minor: 0,
                    gi_id: 2,
                    ci_id: 0,
                },
                SliceRef {
                    gpu_minor: 1,
                    gi_id: 1,
                    ci_id: 0,
                },
            ],
            0..=3,
        );
        let extras = proptest::collection::vec(
            (
                any::<bool>(),
                proptest::option::of(prop_oneof![Just(1u32), Just(195), Just(235), 0u32..300]),
                proptest::option::of(0u32..300),
                1u8..8,
            ),
            0..4,
        );
        (slices, extras).prop_filter_map("valid", |(s, ex)| {
            let ex: Vec<_> = ex
                .into_iter()
                .map(|(c, ma, mi, acc)| crate::policy::DeviceClass {
                    dev_type: if c { DevType::Char } else { DevType::Block },
                    major: ma,
                    minor: mi,
                    access: Access(acc),
                })
                .collect();
            DevicePolicy::for_job(&driver(), &s, &ex).ok()
        })
    }

    proptest! {
        #[test]
        fn program_equals_reference(p in arb_policy(),
            reqs in proptest::collection::vec((any::<bool>(), prop_oneof![Just(195u32), Just(235), Just(237), Just(234), 0u32..400],
                prop_oneof![Just(255u32), Just(254), 0u32..300], 1u8..8), 64)) {
            let prog = generate(&p);
            interp::validate(&prog).unwrap();
            for (c, ma, mi, acc) in reqs {
                let t = if c { DevType::Char } else { DevType::Block };
                prop_assert_eq!(verdict(&prog, t, ma, mi, Access(acc)), p.decide(t, ma, mi, Access(acc)));
            }
        }
    }
}
