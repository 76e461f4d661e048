//! The GGUF file format, read without trusting it: magic, version (2 or 3), metadata,
//! tensor infos and the bytes of the tensors pieval's decoder uses. Every count and length
//! must fit in the file, every value type must be known, nested arrays are refused and
//! `general.alignment`, when given, must be a power of two from 1 to 1 MiB: a hostile file
//! is an error, never a huge allocation or a division by zero.
//! GGUF: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.
//!
//! Strings are read as candle-core 0.11's reader reads them (trailing NULs dropped,
//! invalid UTF-8 replaced), so a tokenizer built from them is the one candle built.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};

use crate::{Error, Result, bail};

/// ggml's type numbers of the tensors read here.
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_1: u32 = 3;
pub const Q8_0: u32 = 8;

/// The name of a ggml type number, for messages.
pub fn type_name(t: u32) -> String {
    const NAMES: [&str; 16] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
    ];
    NAMES
        .get(t as usize)
        .map_or_else(|| format!("ggml type {t}"), |n| n.to_string())
}

/// (values per block, bytes per block) of the types read here.
fn block_layout(t: u32) -> Option<(u64, u64)> {
    match t {
        F32 => Some((1, 4)),
        F16 => Some((1, 2)),
        Q4_1 => Some((32, 20)),
        Q8_0 => Some((32, 34)),
        _ => None,
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// An integer of any width that `u32` holds (a negative or larger one is an error).
    pub fn to_u32(&self) -> Result<u32> {
        let v: i128 = match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            ref other => bail!("expected an integer, found {}", other.kind()),
        };
        u32::try_from(v).map_err(|_| Error::msg(format!("{v} is not a u32")))
    }

    pub fn to_f32(&self) -> Result<f32> {
        match *self {
            Value::F32(v) => Ok(v),
            ref other => bail!("expected an f32, found {}", other.kind()),
        }
    }

    pub fn to_bool(&self) -> Result<bool> {
        match *self {
            Value::Bool(v) => Ok(v),
            ref other => bail!("expected a bool, found {}", other.kind()),
        }
    }

    pub fn as_str(&self) -> Result<&str> {
        match self {
            Value::String(s) => Ok(s),
            other => bail!("expected a string, found {}", other.kind()),
        }
    }

    pub fn as_array(&self) -> Result<&[Value]> {
        match self {
            Value::Array(v) => Ok(v),
            other => bail!("expected an array, found {}", other.kind()),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }
}

/// Where a tensor is and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// ggml's type number.
    pub ggml_type: u32,
    /// Dimensions as the file gives them: the first is the innermost (a matrix's columns).
    pub dims: Vec<u64>,
    /// Offset from the start of the tensor data.
    pub offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A GGUF file's header.
#[derive(Debug)]
pub struct Gguf {
    pub metadata: HashMap<String, Value>,
    pub tensors: HashMap<String, TensorInfo>,
    /// Where the tensor data starts (after the header, aligned).
    data_start: u64,
    len: u64,
}

/// Limits of llama.cpp's reader (GGUF_MAX_STRING_LENGTH, GGUF_MAX_ARRAY_ELEMENTS), which
/// candle's follows.
const MAX_STRING: u64 = 1 << 30;
const MAX_ARRAY: u64 = 1 << 30;

/// A reader that never reads past the end of the file it was told of.
struct Bounded<'a> {
    r: BufReader<&'a mut File>,
    pos: u64,
    len: u64,
}

impl Bounded<'_> {
    fn take(&mut self, n: u64) -> Result<Vec<u8>> {
        if n > self.len.saturating_sub(self.pos) {
            bail!(
                "the header claims {n} more byte(s) at offset {}, past the end of the file",
                self.pos
            );
        }
        let mut buf = vec![0u8; n as usize];
        self.r.read_exact(&mut buf).map_err(Error::io)?;
        self.pos += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N as u64)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String> {
        let n = self.u64()?;
        if n > MAX_STRING && n <= self.len.saturating_sub(self.pos) {
            bail!("a string of {n} bytes (at most {MAX_STRING} are read)");
        }
        let mut v = self.take(n)?;
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    fn scalar(&mut self, t: u32) -> Result<Value> {
        Ok(match t {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => bail!("a bool of value {b}"),
            },
            8 => Value::String(self.string()?),
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            9 => bail!("array of value type 9 (nested arrays are not read)"),
            t => bail!("unknown metadata value type {t}"),
        })
    }

    fn value(&mut self, t: u32) -> Result<Value> {
        if t != 9 {
            return self.scalar(t);
        }
        let inner = self.u32()?;
        let n = self.u64()?;
        // Each element takes at least one byte (a string at least eight): a count past
        // the file's end is refused before anything is allocated for it.
        let least = match inner {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => bail!("array of value type 9 (nested arrays are not read)"),
            t => bail!("unknown metadata value type {t}"),
        };
        if n.saturating_mul(least) > self.len.saturating_sub(self.pos) || n > MAX_ARRAY {
            bail!("an array of {n} values runs past the end of the file");
        }
        // Grown as values are read, not reserved from the count: the file's length can be
        // a sparse file's.
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.scalar(inner)?);
        }
        Ok(Value::Array(out))
    }
}

impl Gguf {
    /// Read a GGUF header. Where the file is left is unspecified: seek before reading it.
    pub fn read(file: &mut File) -> Result<Self> {
        let len = file.metadata().map_err(Error::io)?.len();
        file.seek(SeekFrom::Start(0)).map_err(Error::io)?;
        let mut r = Bounded {
            r: BufReader::new(file),
            pos: 0,
            len,
        };
        if r.take(4)? != b"GGUF" {
            bail!("no GGUF magic");
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            bail!("GGUF version {version} (2 and 3 are read)");
        }
        let tensors = r.u64()?;
        let kvs = r.u64()?;
        // A metadata pair takes at least 12 bytes, a tensor info at least 24.
        if kvs.saturating_mul(12) > len || tensors.saturating_mul(24) > len {
            bail!("{kvs} metadata pairs and {tensors} tensors cannot fit in {len} bytes");
        }
        let mut metadata = HashMap::new();
        for _ in 0..kvs {
            let key = r.string()?;
            let t = r.u32()?;
            let value = r.value(t).map_err(|e| e.context(&key))?;
            metadata.insert(key, value);
        }
        // GGUF gives the alignment as a u32; candle's reader also takes the narrower
        // integers (and falls back to 32 on any other type: refused here, so that both
        // readers find the tensors at the same place).
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(
                v @ (Value::U8(_)
                | Value::U16(_)
                | Value::U32(_)
                | Value::I8(_)
                | Value::I16(_)
                | Value::I32(_)),
            ) => u64::from(v.to_u32().map_err(|e| e.context("general.alignment"))?),
            Some(other) => bail!(
                "general.alignment has value type {}, not a u32",
                other.kind()
            ),
        };
        if alignment == 0 || !alignment.is_power_of_two() || alignment > 1 << 20 {
            bail!("general.alignment is {alignment}: it must be a power of two from 1 to 1 MiB");
        }
        let mut infos = HashMap::new();
        for _ in 0..tensors {
            let name = r.string()?;
            let n = r.u32()?;
            if n == 0 || n > 8 {
                bail!("tensor {name}: {n} dimensions");
            }
            let mut dims = Vec::with_capacity(n as usize);
            let mut elements: u64 = 1;
            for _ in 0..n {
                let d = r.u64()?;
                elements = elements
                    .checked_mul(d)
                    .filter(|e| *e <= len.saturating_mul(8))
                    .ok_or_else(|| Error::msg(format!("tensor {name}: larger than the file")))?;
                dims.push(d);
            }
            let ggml_type = r.u32()?;
            let offset = r.u64()?;
            let info = TensorInfo {
                ggml_type,
                dims,
                offset,
            };
            if infos.insert(name.clone(), info).is_some() {
                bail!("tensor {name} is described twice");
            }
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        // Tensors that overlap or repeat one another's bytes could make a small file
        // load as many times its size: all of them together must fit in the data.
        let mut claimed: u64 = 0;
        for (name, info) in &infos {
            if let Some((per_block, block_bytes)) = block_layout(info.ggml_type) {
                let bytes = (info.elements() / per_block).saturating_mul(block_bytes);
                claimed = claimed.saturating_add(bytes);
                if claimed > len.saturating_sub(data_start) {
                    bail!("tensor {name}: the tensors claim more bytes than the file holds");
                }
            }
        }
        Ok(Self {
            metadata,
            tensors: infos,
            data_start,
            len,
        })
    }

    /// A metadata value, or an error naming the key.
    pub fn get(&self, key: &str) -> Result<&Value> {
        self.metadata
            .get(key)
            .ok_or_else(|| Error::msg(format!("no metadata {key}")))
    }

    /// The bytes of tensor `name` (F32, F16, Q4_1 or Q8_0), checked to lie in the file.
    pub fn tensor_bytes(&self, file: &mut File, name: &str) -> Result<(&TensorInfo, Vec<u8>)> {
        let info = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::msg(format!("no tensor {name}")))?;
        let Some((per_block, block_bytes)) = block_layout(info.ggml_type) else {
            bail!("{name}: {} weights", type_name(info.ggml_type));
        };
        let elements = info.elements();
        if elements % per_block != 0 || info.dims[0] % per_block != 0 {
            bail!(
                "{name}: {} values do not fill {} blocks of {per_block}",
                info.dims[0],
                type_name(info.ggml_type)
            );
        }
        let bytes = elements / per_block * block_bytes;
        let start = self.data_start.checked_add(info.offset);
        match start.and_then(|s| s.checked_add(bytes)) {
            Some(end) if end <= self.len => {}
            _ => bail!(
                "{name}: {bytes} bytes at offset {} of the tensor data, past the end of the file",
                info.offset
            ),
        }
        file.seek(SeekFrom::Start(self.data_start + info.offset))
            .map_err(Error::io)?;
        let mut data = vec![0u8; bytes as usize];
        file.read_exact(&mut data).map_err(Error::io)?;
        Ok((info, data))
    }

    /// Tensor `name` as f32 values (an F32 or F16 tensor: the norms' weights).
    pub fn vector(&self, file: &mut File, name: &str) -> Result<Vec<f32>> {
        let (info, data) = self.tensor_bytes(file, name)?;
        let v: Vec<f32> = match info.ggml_type {
            F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect(),
            F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            t => bail!("{name}: {} values, not F32 or F16", type_name(t)),
        };
        if v.is_empty() {
            bail!("{name}: empty");
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    type Kv<'a> = (&'a str, u32, Vec<u8>);
    type Info<'a> = (&'a str, &'a [u64], u32, u64);

    /// The bytes of a GGUF v3 file: `kvs` as (key, type, value bytes), tensor infos, zeros
    /// up to `align`, then `data`.
    fn bytes(kvs: &[Kv], tensors: &[Info], align: usize, data: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        let s = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        for (k, t, v) in kvs {
            s(&mut b, k);
            b.extend(t.to_le_bytes());
            b.extend(v);
        }
        for (name, dims, t, off) in tensors {
            s(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.to_le_bytes());
            b.extend(off.to_le_bytes());
        }
        while b.len() % align != 0 {
            b.push(0);
        }
        b.extend(data);
        b
    }

    fn file(kvs: &[Kv], tensors: &[Info], data: &[u8]) -> File {
        file_of(&bytes(kvs, tensors, 32, data))
    }

    /// A file of `b` in a temporary folder (removed at once; the file stays open).
    fn file_of(b: &[u8]) -> File {
        let dir = std::env::temp_dir().join(format!(
            "pieval-llama-gguf-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.join("m.gguf"))
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        f.write_all(b).unwrap();
        f
    }

    fn string(s: &str) -> Vec<u8> {
        let mut b = (s.len() as u64).to_le_bytes().to_vec();
        b.extend(s.as_bytes());
        b
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn reads_metadata_tensors_and_their_bytes() {
        let mut tokens = 8u32.to_le_bytes().to_vec();
        tokens.extend(2u64.to_le_bytes());
        tokens.extend(string("a"));
        tokens.extend(string("b\0\0"));
        let mut data = f32s(&[1.5, -2.0]);
        data.resize(32, 0);
        data.extend(half::f16::from_f32(0.25).to_le_bytes());
        data.extend(half::f16::from_f32(-4.0).to_le_bytes());
        let mut f = file(
            &[
                ("general.architecture", 8, string("llama")),
                ("llama.block_count", 4, 30u32.to_le_bytes().to_vec()),
                ("tokenizer.ggml.tokens", 9, tokens),
                ("eps", 6, 1e-5f32.to_le_bytes().to_vec()),
            ],
            &[
                ("output_norm.weight", &[2], F32, 0),
                ("half.weight", &[2], F16, 32),
            ],
            &data,
        );
        let g = Gguf::read(&mut f).unwrap();
        let md = |k: &str| g.get(k).unwrap();
        assert_eq!(md("general.architecture").as_str().unwrap(), "llama");
        assert_eq!(md("llama.block_count").to_u32().unwrap(), 30);
        assert_eq!(md("eps").to_f32().unwrap(), 1e-5);
        let toks = md("tokenizer.ggml.tokens").as_array().unwrap();
        assert_eq!(toks, [Value::String("a".into()), Value::String("b".into())]);
        assert_eq!(g.vector(&mut f, "output_norm.weight").unwrap(), [1.5, -2.0]);
        assert_eq!(g.vector(&mut f, "half.weight").unwrap(), [0.25, -4.0]);
        let e = g.get("missing").unwrap_err().to_string();
        assert!(e.contains("no metadata missing"), "{e}");
    }

    /// The tensor data starts at the alignment the file names, not at 32.
    #[test]
    fn the_data_starts_at_the_files_alignment() {
        let kvs = [("general.alignment", 4, 256u32.to_le_bytes().to_vec())];
        let infos: [Info; 1] = [("v", &[2], F32, 0)];
        let mut f = file_of(&bytes(&kvs, &infos, 256, &f32s(&[3.0, 4.0])));
        let g = Gguf::read(&mut f).unwrap();
        assert_eq!(g.vector(&mut f, "v").unwrap(), [3.0, 4.0]);
    }

    #[test]
    fn hostile_headers_are_errors() {
        let array = |inner: u32, n: u64| {
            let mut b = inner.to_le_bytes().to_vec();
            b.extend(n.to_le_bytes());
            b
        };
        let u32v = |v: u32| v.to_le_bytes().to_vec();
        let nine_dims: &[u64] = &[1; 9];
        let cases: Vec<(File, &str)> = vec![
            (
                file(&[("k", 9, array(0, u64::MAX))], &[], &[]),
                "runs past the end",
            ),
            (
                file(&[("k", 9, array(4, 1 << 31))], &[], &[]),
                "runs past the end",
            ),
            (file(&[("k", 9, array(9, 1))], &[], &[]), "nested arrays"),
            (
                file(&[("k", 99, vec![])], &[], &[]),
                "unknown metadata value type 99",
            ),
            (
                file(&[("general.alignment", 4, u32v(3))], &[], &[]),
                "power of two",
            ),
            (
                file(&[("general.alignment", 4, u32v(0))], &[], &[]),
                "power of two",
            ),
            (
                file(
                    &[("general.alignment", 5, (-1i32).to_le_bytes().to_vec())],
                    &[],
                    &[],
                ),
                "-1 is not a u32",
            ),
            (
                file(
                    &[("general.alignment", 10, 32u64.to_le_bytes().to_vec())],
                    &[],
                    &[],
                ),
                "value type u64, not a u32",
            ),
            (
                file(&[("k", 8, u64::MAX.to_le_bytes().to_vec())], &[], &[]),
                "past the end",
            ),
            (
                file(&[("k", 8, 1000u64.to_le_bytes().to_vec())], &[], &[]),
                "past the end",
            ),
            (file(&[("k", 7, vec![2])], &[], &[]), "a bool of value 2"),
            (
                file(&[], &[("t", &[u64::MAX, 4], F32, 0)], &[]),
                "larger than the file",
            ),
            (file(&[], &[("t", &[], F32, 0)], &[]), "0 dimensions"),
            (file(&[], &[("t", nine_dims, F32, 0)], &[]), "9 dimensions"),
            (
                file(&[], &[("t", &[2], F32, 0), ("t", &[2], F32, 8)], &[0; 16]),
                "described twice",
            ),
            // Two tensors on the same eight bytes: together more than the file holds.
            (
                file(&[], &[("a", &[2], F32, 0), ("b", &[2], F32, 0)], &[0; 8]),
                "claim more bytes than the file holds",
            ),
        ];
        for (mut f, want) in cases {
            let e = Gguf::read(&mut f).unwrap_err().to_string();
            assert!(e.contains(want), "{e} (wanted {want})");
        }
        // A string longer than llama.cpp reads, in a (sparse) file that holds it.
        let f = file(
            &[("k", 8, ((1u64 << 30) + 1).to_le_bytes().to_vec())],
            &[],
            &[],
        );
        f.set_len(2 << 30).unwrap();
        let e = Gguf::read(&mut { f }).unwrap_err().to_string();
        assert!(e.contains("at most 1073741824"), "{e}");
        // Counts the file cannot hold, in the header itself.
        let mut b = bytes(&[], &[], 1, &[]);
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = Gguf::read(&mut file_of(&b)).unwrap_err().to_string();
        assert!(e.contains("cannot fit"), "{e}");
        // Cut anywhere inside a header: an error, never a panic.
        let whole = bytes(
            &[("s", 8, string("hello")), ("n", 4, u32v(7))],
            &[("v", &[2], F32, 0)],
            32,
            &f32s(&[1.0, 2.0]),
        );
        for cut in 0..whole.len() - 8 {
            let e = Gguf::read(&mut file_of(&whole[..cut]));
            assert!(e.is_err(), "cut at {cut}");
        }
        // Tensor bytes: out of the file, a layout that does not fill its blocks, a type
        // not read here, a vector that is not F32 / F16.
        let q8 = vec![0u8; 136];
        let read = |infos: &[Info], data: &[u8], name: &str| {
            let mut f = file(&[], infos, data);
            let g = Gguf::read(&mut f).unwrap();
            match name {
                "vector" => g.vector(&mut f, "t").map(|_| ()),
                _ => g.tensor_bytes(&mut f, "t").map(|_| ()),
            }
            .unwrap_err()
            .to_string()
        };
        let cases: [(&[Info], &[u8], &str, &str); 5] = [
            (
                &[("t", &[64, 2], Q8_0, 1 << 40)],
                &q8,
                "bytes",
                "past the end of the file",
            ),
            (
                &[("t", &[64, 2], Q8_0, u64::MAX)],
                &q8,
                "bytes",
                "past the end of the file",
            ),
            (&[("t", &[48, 2], Q8_0, 0)], &q8, "bytes", "do not fill"),
            (&[("t", &[64, 2], 12, 0)], &[], "bytes", "Q4_K weights"),
            (&[("t", &[64], Q8_0, 0)], &q8, "vector", "not F32 or F16"),
        ];
        for (infos, data, how, want) in cases {
            let e = read(infos, data, how);
            assert!(e.contains(want), "{e} (wanted {want})");
        }
    }

    #[test]
    fn integers_are_read_as_u32_only_where_they_fit() {
        assert_eq!(Value::I64(7).to_u32().unwrap(), 7);
        assert_eq!(Value::U8(255).to_u32().unwrap(), 255);
        for v in [Value::I64(-1), Value::U64(1 << 32), Value::I8(-3)] {
            assert!(v.to_u32().is_err(), "{v:?}");
        }
        assert!(Value::F32(1.0).to_u32().is_err());
    }
}
