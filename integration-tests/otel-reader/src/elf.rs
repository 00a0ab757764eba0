//! The little of ELF64 a thread context reader needs: a TLS symbol of `.dynsym` and
//! the `PT_TLS` segment it lives in.

/// A TLS variable of an executable, as its dynamic symbol table and `PT_TLS`
/// segment describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsSymbol {
    /// The symbol's value: its offset in the module's TLS block.
    pub offset: u64,
    /// The symbol's size.
    pub size: u64,
    /// `PT_TLS`: virtual address, size in memory, alignment.
    pub tls_vaddr: u64,
    /// Size of the TLS block in memory.
    pub tls_memsz: u64,
    /// Alignment of the TLS block.
    pub tls_align: u64,
}

impl TlsSymbol {
    /// The executable's TLS block starts this many bytes below the thread pointer
    /// (x86_64, variant II: the executable's block is the first below it; glibc's
    /// `_dl_determine_tlsoffset` rounds its size up to its alignment, keeping the
    /// block's first byte at the offset its address has within that alignment).
    pub fn block_offset(&self) -> u64 {
        let align = self.tls_align.max(1);
        let firstbyte = self.tls_vaddr.wrapping_neg() & (align - 1);
        (self.tls_memsz - firstbyte).div_ceil(align) * align + firstbyte
    }

    /// The variable's address in the thread whose thread pointer is `tp`.
    pub fn address(&self, tp: u64) -> u64 {
        tp - self.block_offset() + self.offset
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

const SHT_DYNSYM: u32 = 11;
const STT_TLS: u8 = 6;
const PT_TLS: u32 = 7;

/// Finds the TLS symbol `name` in the dynamic symbol table (`.dynsym`) of the ELF64
/// little-endian image `elf`. `None` when the image has no such exported symbol.
pub fn find_tls_symbol(elf: &[u8], name: &str) -> Option<TlsSymbol> {
    if elf.get(..4)? != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return None;
    }
    let shoff = u64_at(elf, 0x28)? as usize;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    let section = |i: usize| -> Option<(u32, usize, usize, u32, usize)> {
        let h = shoff + i * shentsize;
        Some((
            u32_at(elf, h + 4)?,
            u64_at(elf, h + 24)? as usize,
            u64_at(elf, h + 32)? as usize,
            u32_at(elf, h + 40)?,
            u64_at(elf, h + 56)? as usize,
        ))
    };
    let (offset, size) = (0..shnum).find_map(|i| {
        let (kind, off, size, link, entsize) = section(i)?;
        if kind != SHT_DYNSYM || entsize != 24 {
            return None;
        }
        let (_, str_off, str_size, _, _) = section(link as usize)?;
        let strings = elf.get(str_off..str_off + str_size)?;
        elf.get(off..off + size)?.chunks_exact(24).find_map(|sym| {
            let name_at = u32_at(sym, 0)? as usize;
            let info = sym[4];
            let sym_name = strings.get(name_at..)?.split(|&b| b == 0).next()?;
            (sym_name == name.as_bytes() && info & 0xf == STT_TLS)
                .then(|| Some((u64_at(sym, 8)?, u64_at(sym, 16)?)))?
        })
    })?;
    let phoff = u64_at(elf, 0x20)? as usize;
    let phentsize = u16_at(elf, 0x36)? as usize;
    let phnum = u16_at(elf, 0x38)? as usize;
    let tls = (0..phnum).find_map(|i| {
        let h = phoff + i * phentsize;
        (u32_at(elf, h)? == PT_TLS).then(|| {
            Some((
                u64_at(elf, h + 16)?,
                u64_at(elf, h + 40)?,
                u64_at(elf, h + 48)?,
            ))
        })?
    })?;
    Some(TlsSymbol {
        offset,
        size,
        tls_vaddr: tls.0,
        tls_memsz: tls.1,
        tls_align: tls.2,
    })
}
