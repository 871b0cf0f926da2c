//! Element types: `DType` is DLPack's (code, bits, lanes); `Element` maps Rust types to it.
use std::fmt;

use crate::ffi::{self, DLDataType};

/// A tensor's element type, as DLPack describes it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DType {
    /// DLPack type code (`kDLInt`, `kDLUInt`, `kDLFloat`, `kDLBfloat`, `kDLComplex`, `kDLBool`, ...).
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for every scalar type).
    pub lanes: u16,
}

impl DType {
    pub const BOOL: DType = DType::new(ffi::K_DL_BOOL, 8);
    pub const I8: DType = DType::new(ffi::K_DL_INT, 8);
    pub const I16: DType = DType::new(ffi::K_DL_INT, 16);
    pub const I32: DType = DType::new(ffi::K_DL_INT, 32);
    pub const I64: DType = DType::new(ffi::K_DL_INT, 64);
    pub const U8: DType = DType::new(ffi::K_DL_UINT, 8);
    pub const U16: DType = DType::new(ffi::K_DL_UINT, 16);
    pub const U32: DType = DType::new(ffi::K_DL_UINT, 32);
    pub const U64: DType = DType::new(ffi::K_DL_UINT, 64);
    pub const F16: DType = DType::new(ffi::K_DL_FLOAT, 16);
    pub const BF16: DType = DType::new(ffi::K_DL_BFLOAT, 16);
    pub const F32: DType = DType::new(ffi::K_DL_FLOAT, 32);
    pub const F64: DType = DType::new(ffi::K_DL_FLOAT, 64);
    pub const C64: DType = DType::new(ffi::K_DL_COMPLEX, 64);
    pub const C128: DType = DType::new(ffi::K_DL_COMPLEX, 128);

    const fn new(code: u8, bits: u8) -> DType {
        DType { code, bits, lanes: 1 }
    }

    /// Bytes per element (rounded up for sub-byte types).
    pub fn itemsize(self) -> usize {
        (self.bits as usize * self.lanes as usize).div_ceil(8)
    }

    pub(crate) fn to_dl(self) -> DLDataType {
        DLDataType { code: self.code, bits: self.bits, lanes: self.lanes }
    }

    pub(crate) fn from_dl(d: DLDataType) -> DType {
        DType { code: d.code, bits: d.bits, lanes: d.lanes }
    }

    /// NumPy's name for it ("float32", "bfloat16", "bool", ...), or a DLPack description.
    pub fn name(self) -> String {
        let base = match (self.code, self.bits) {
            (ffi::K_DL_BOOL, 8) => "bool",
            (ffi::K_DL_BFLOAT, 16) => "bfloat16",
            (ffi::K_DL_INT, _) => "int",
            (ffi::K_DL_UINT, _) => "uint",
            (ffi::K_DL_FLOAT, _) => "float",
            (ffi::K_DL_COMPLEX, _) => "complex",
            _ => return format!("dlpack(code={}, bits={}, lanes={})", self.code, self.bits, self.lanes),
        };
        let mut s = match self.code {
            ffi::K_DL_BOOL | ffi::K_DL_BFLOAT => base.to_string(),
            _ => format!("{base}{}", self.bits),
        };
        if self.lanes != 1 {
            s.push_str(&format!("x{}", self.lanes));
        }
        s
    }
}

impl fmt::Debug for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DType({})", self.name())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// IEEE 754 half precision, as its raw bits (tensorwire moves it; arithmetic is the caller's).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// bfloat16 (the upper half of an f32), as its raw bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BF16(pub u16);

impl BF16 {
    /// The bfloat16 nearest below `x` (truncation of the f32's low 16 bits).
    pub fn from_f32_truncated(x: f32) -> BF16 {
        BF16((x.to_bits() >> 16) as u16)
    }
    /// The exact f32 value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type tensorwire stores as one element of a `DType`. Sealed: implemented for `bool`, `i8`..`i64`,
/// `u8`..`u64`, `f32`, `f64`, `F16` and `BF16`.
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The dtype of a tensor of this type.
    const DTYPE: DType;
}

/// An `Element` every bit pattern of which is a valid value: memory written by anyone (another process, a C
/// library, an uninitialised pool buffer) can be viewed as a slice of it. `bool` is not one (only 0 and 1 are
/// valid), so bool tensors are read with `Tensor::to_vec`, which checks each byte.
pub trait Pod: Element {}

macro_rules! elements {
    ($($t:ty => $d:expr, pod: $pod:tt;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t { const DTYPE: DType = $d; }
        elements!(@pod $t, $pod);
    )*};
    (@pod $t:ty, true) => { impl Pod for $t {} };
    (@pod $t:ty, false) => {};
}

elements! {
    bool => DType::BOOL, pod: false;
    i8 => DType::I8, pod: true;
    i16 => DType::I16, pod: true;
    i32 => DType::I32, pod: true;
    i64 => DType::I64, pod: true;
    u8 => DType::U8, pod: true;
    u16 => DType::U16, pod: true;
    u32 => DType::U32, pod: true;
    u64 => DType::U64, pod: true;
    f32 => DType::F32, pod: true;
    f64 => DType::F64, pod: true;
    F16 => DType::F16, pod: true;
    BF16 => DType::BF16, pod: true;
}
