//! A reference interpreter for the instruction subset [`super::generate`] emits. It checks what
//! the kernel verifier would (forward-only jumps in bounds, context reads at the three u32
//! fields, r0 set to 0 or 1 at exit) and computes the verdict. Used by unit tests (no root
//! needed) and by `doctor` as a self-check of the generator.

use super::{op, Insn};

/// Why a program was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("instruction {pc}: {msg}")]
pub struct InterpError {
    pub pc: usize,
    pub msg: String,
}

fn err(pc: usize, msg: impl Into<String>) -> InterpError {
    InterpError {
        pc,
        msg: msg.into(),
    }
}

/// Static checks: known opcodes only, forward jumps in bounds, registers r0..r5 written
/// (r1 = ctx read-only), last instruction is exit.
pub fn validate(prog: &[Insn]) -> Result<(), InterpError> {
    if prog.is_empty() || prog.last().map(|i| i.code) != Some(op::EXIT) {
        return Err(err(prog.len(), "program must end with exit"));
    }
    for (pc, i) in prog.iter().enumerate() {
        match i.code {
            op::LDXW => {
                if i.src() != 1 || ![0, 4, 8].contains(&i.off) {
                    return Err(err(pc, "context load must be r1+0/4/8"));
                }
            }
            op::MOV64_IMM | op::MOV64_REG | op::AND64_IMM | op::RSH64_IMM | op::EXIT => {}
            op::JA | op::JEQ_IMM | op::JNE_IMM | op::JSET_IMM => {
                let t = pc as i64 + 1 + i.off as i64;
                if i.off < 0 || t >= prog.len() as i64 {
                    return Err(err(pc, format!("jump offset {} out of bounds", i.off)));
                }
            }
            c => return Err(err(pc, format!("unsupported opcode {c:#x}"))),
        }
        if !is_jmp(i.code) && i.code != op::EXIT && i.dst() == 1 {
            return Err(err(pc, "r1 (context) must not be written"));
        }
        if i.dst() > 9 || i.src() > 9 {
            return Err(err(pc, "register out of range"));
        }
    }
    // Every instruction must be reachable (the kernel verifier rejects dead code).
    let mut reach = vec![false; prog.len()];
    reach[0] = true;
    for pc in 0..prog.len() {
        if !reach[pc] {
            return Err(err(pc, "unreachable instruction"));
        }
        let i = prog[pc];
        if is_jmp(i.code) {
            reach[pc + 1 + i.off as usize] = true;
        }
        if i.code != op::JA && i.code != op::EXIT && pc + 1 < prog.len() {
            reach[pc + 1] = true;
        }
    }
    Ok(())
}

fn is_jmp(c: u8) -> bool {
    matches!(c, op::JA | op::JEQ_IMM | op::JNE_IMM | op::JSET_IMM)
}

/// Run the program on a device context; returns r0.
pub fn run(prog: &[Insn], access_type: u32, major: u32, minor: u32) -> Result<u64, InterpError> {
    validate(prog)?;
    let ctx = [access_type, major, minor];
    let mut r = [0u64; 11];
    let mut init = [false; 11];
    init[1] = true;
    let mut pc = 0usize;
    // Forward-only jumps: at most prog.len() steps.
    for _ in 0..=prog.len() {
        let i = prog[pc];
        let (d, s) = (i.dst() as usize, i.src() as usize);
        let rd = |init: &[bool; 11], reg: usize| {
            if init[reg] {
                Ok(())
            } else {
                Err(err(pc, format!("read of uninitialized r{reg}")))
            }
        };
        match i.code {
            op::LDXW => {
                r[d] = ctx[(i.off / 4) as usize] as u64;
                init[d] = true;
            }
            op::MOV64_IMM => {
                r[d] = i.imm as i64 as u64;
                init[d] = true;
            }
            op::MOV64_REG => {
                rd(&init, s)?;
                r[d] = r[s];
                init[d] = true;
            }
            op::AND64_IMM => {
                rd(&init, d)?;
                r[d] &= i.imm as i64 as u64;
            }
            op::RSH64_IMM => {
                rd(&init, d)?;
                r[d] >>= i.imm as u32 & 63;
            }
            op::JA => {
                pc = pc + 1 + i.off as usize;
                continue;
            }
            op::JEQ_IMM | op::JNE_IMM | op::JSET_IMM => {
                rd(&init, d)?;
                let imm = i.imm as i64 as u64;
                let taken = match i.code {
                    op::JEQ_IMM => r[d] == imm,
                    op::JNE_IMM => r[d] != imm,
                    _ => r[d] & imm != 0,
                };
                if taken {
                    pc = pc + 1 + i.off as usize;
                    continue;
                }
            }
            op::EXIT => {
                rd(&init, 0)?;
                if r[0] > 1 {
                    return Err(err(pc, "device programs must return 0 or 1"));
                }
                return Ok(r[0]);
            }
            _ => unreachable!("validated"),
        }
        pc += 1;
        if pc >= prog.len() {
            return Err(err(pc, "fell off the end"));
        }
    }
    Err(err(pc, "no exit reached"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: src << 4 | dst,
            off,
            imm,
        }
    }

    #[test]
    fn rejects_bad_programs() {
        assert!(validate(&[]).is_err());
        assert!(validate(&[i(op::MOV64_IMM, 0, 0, 0, 1)]).is_err()); // no exit
        assert!(validate(&[i(0x07, 0, 0, 0, 1), i(op::EXIT, 0, 0, 0, 0)]).is_err()); // add: unsupported
        assert!(validate(&[i(op::JA, 0, 0, -1, 0), i(op::EXIT, 0, 0, 0, 0)]).is_err()); // backward
        assert!(validate(&[i(op::JA, 0, 0, 5, 0), i(op::EXIT, 0, 0, 0, 0)]).is_err()); // out of bounds
        assert!(validate(&[i(op::LDXW, 2, 1, 12, 0), i(op::EXIT, 0, 0, 0, 0)]).is_err()); // past ctx
                                                                                          // dead code after exit
        let dead = [
            i(op::MOV64_IMM, 0, 0, 0, 1),
            i(op::EXIT, 0, 0, 0, 0),
            i(op::MOV64_IMM, 0, 0, 0, 0),
            i(op::EXIT, 0, 0, 0, 0),
        ];
        assert!(validate(&dead).unwrap_err().msg.contains("unreachable"));
        // r0 uninitialized at exit
        assert!(run(&[i(op::EXIT, 0, 0, 0, 0)], 0, 0, 0).is_err());
        // r0 = 2 is not a device verdict
        assert!(run(
            &[i(op::MOV64_IMM, 0, 0, 0, 2), i(op::EXIT, 0, 0, 0, 0)],
            0,
            0,
            0
        )
        .is_err());
        assert_eq!(
            run(
                &[i(op::MOV64_IMM, 0, 0, 0, 1), i(op::EXIT, 0, 0, 0, 0)],
                0,
                0,
                0
            ),
            Ok(1)
        );
    }
}
