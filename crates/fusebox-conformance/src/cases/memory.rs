//! Cases of the memory family: the device and query ops (`name`, `device`, `supports`,
//! `upload`, `to_host`, `uses_device_storage`, `synchronize`, the two `release_*`),
//! `zeros`, `copy`, `copy_into`, `cast`, `preprocess_linear_weight` and FP8 E4M3 decoding.

use std::any::Any;
use std::sync::Arc;

use fusebox::{ComputeBackend, DType, Device, DeviceBuffer, DeviceKind, Error, Op, Result as FbResult, Shape, Tensor};

use crate::array::Array;
use crate::case::{catch, Case, CaseKind, Input, OpCase};
use crate::reference::memory as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

/// Memory on a device that no backend owns: every backend must refuse tensors over it.
#[derive(Debug)]
struct ForeignBuffer {
    bytes: usize,
}

impl DeviceBuffer for ForeignBuffer {
    fn device(&self) -> Device {
        Device { kind: DeviceKind::Gpu, index: 99, name: "conformance-foreign-device".into(), memory_bytes: None }
    }
    fn byte_len(&self) -> usize {
        self.bytes
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A tensor of `shape` and `dtype` living on [`ForeignBuffer`] memory.
pub(crate) fn foreign_tensor(shape: &[usize], dtype: DType) -> Tensor {
    let bytes = dtype.storage_bytes(shape.iter().product());
    Tensor::from_device(Box::new(ForeignBuffer { bytes }), shape.to_vec(), dtype).expect("buffer large enough")
}

/// `r`, with a fusebox error turned into a message naming `what`.
pub(crate) fn ok<T>(what: &str, r: FbResult<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what} failed: {e}"))
}

/// The raw bytes of `t` brought to the host.
pub(crate) fn host_bytes<B: ComputeBackend + ?Sized>(b: &B, t: &Tensor) -> Result<Vec<u8>, String> {
    let h = ok("to_host", b.to_host(t))?;
    Ok(ok("reading host bytes", h.host_bytes())?.to_vec())
}

/// The values of a float or U32 tensor brought to the host.
pub(crate) fn host_values<B: ComputeBackend + ?Sized>(b: &B, t: &Tensor) -> Result<Array, String> {
    let h = ok("to_host", b.to_host(t))?;
    if h.dtype().is_float() || h.dtype() == DType::U32 {
        Ok(Array::from_tensor(&h))
    } else {
        Err(format!("a {} tensor has no element values to compare", h.dtype()))
    }
}

/// Uploads every tensor of `inputs`.
pub(crate) fn upload_all<B: ComputeBackend + ?Sized>(b: &B, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
    inputs.iter().map(|t| ok("upload", b.upload(t))).collect()
}

type CallOne<B> = Arc<dyn Fn(&B, &[Tensor]) -> FbResult<Tensor> + Send + Sync>;

/// A forward case for inputs the generic builder cannot read as values (block formats,
/// FP8 codes): uploads `inputs`, calls the backend, checks the output's dtype and compares
/// its values with `want(inputs)`, computed by a twin when the case runs.
pub(crate) fn forward_case<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    name: impl Into<String>,
    inputs: Vec<Tensor>,
    out_dtype: DType,
    tol: Tolerance,
    call: impl Fn(&B, &[Tensor]) -> FbResult<Tensor> + Send + Sync + 'static,
    want: impl Fn(&[Tensor]) -> Array + Send + Sync + 'static,
) -> Case<B> {
    let call: CallOne<B> = Arc::new(call);
    Case::custom(op, CaseKind::Forward, name, move |b: &B| {
        let up = upload_all(b, &inputs)?;
        let out = catch(|| call(b, &up))?.map_err(|e| format!("returned an error: {e}"))?;
        if out.dtype() != out_dtype {
            return Err(format!("output dtype {}, expected {out_dtype}", out.dtype()));
        }
        let got = host_values(b, &out)?;
        tol.check("output", &got, &want(&inputs))
    })
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    v.extend(query_cases());
    v.extend(transfer_cases());
    v.extend(zeros_cases());
    v.extend(copy_cases());
    v.extend(copy_into_cases());
    v.extend(fill_cases());
    v.extend(cast_cases());
    v.extend(preprocess_cases());
    v.extend(f8_cases());
    v
}

// ───────────────────────────── queries ─────────────────────────────

fn query_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let probe = Rng::new(1).tensor([5, 7], -1.0, 1.0);
    let (p1, p2, p3) = (probe.clone(), probe.clone(), probe.clone());
    vec![
        Case::custom(Op::Name, CaseKind::Property, "name is non-empty and stable", |b: &B| {
            let name = b.name().to_string();
            if name.trim().is_empty() {
                return Err("empty backend name".into());
            }
            if b.name() != name {
                return Err(format!("name changed between calls: '{name}' then '{}'", b.name()));
            }
            Ok(())
        }),
        Case::custom(
            Op::Device,
            CaseKind::Property,
            "device is named; uploaded tensors live on its kind of memory",
            move |b: &B| {
                let device = b.device();
                if device.name.trim().is_empty() {
                    return Err("device has an empty name".into());
                }
                let t = ok("upload", b.upload(&p1))?;
                let on = t.device();
                if b.uses_device_storage() {
                    if on.kind != device.kind || t.is_host() {
                        return Err(format!("uploaded tensor on {on:?}, backend device {device:?}"));
                    }
                } else if !t.is_host() || device.kind != DeviceKind::Cpu {
                    return Err(format!("host backend: device {device:?}, uploaded tensor on {on:?}"));
                }
                Ok(())
            },
        ),
        Case::custom(
            Op::Supports,
            CaseKind::Property,
            "supports answers every op consistently; a host backend runs every op natively",
            |b: &B| {
                let host_backend = !b.uses_device_storage() && b.device().kind == DeviceKind::Cpu;
                for &op in Op::ALL {
                    let first = b.supports(op);
                    if b.supports(op) != first {
                        return Err(format!("supports({op}) changed between calls"));
                    }
                    if host_backend && !first {
                        return Err(format!("host backend reports {op} as a fallback"));
                    }
                }
                Ok(())
            },
        ),
        Case::custom(
            Op::UsesDeviceStorage,
            CaseKind::Property,
            "uses_device_storage matches where upload and zeros put tensors",
            move |b: &B| {
                let uses = b.uses_device_storage();
                let up = ok("upload", b.upload(&p2))?;
                let z = ok("zeros", b.zeros(&Shape::new([3, 4]), DType::F32))?;
                if up.is_host() == uses || z.is_host() == uses {
                    return Err(format!(
                        "uses_device_storage = {uses}, but upload gave a {} tensor and zeros a {} one",
                        if up.is_host() { "host" } else { "device" },
                        if z.is_host() { "host" } else { "device" }
                    ));
                }
                Ok(())
            },
        ),
        Case::custom(
            Op::Synchronize,
            CaseKind::Property,
            "synchronize after queued work, whose results are then complete",
            move |b: &B| {
                let x = ok("upload", b.upload(&p3))?;
                let c = ok("copy", b.copy(&x))?;
                let h = ok("cast", b.cast(&c, DType::F16))?;
                ok("synchronize", b.synchronize())?;
                let want = twin::cast_to_f16(&Array::from_tensor(&p3));
                Tolerance::EXACT.check("cast after synchronize", &host_values(b, &h)?, &want)
            },
        ),
        release_case(Op::ReleaseResources, |b: &B| b.release_resources()),
        release_case(Op::ReleaseTemporaryResources, |b: &B| b.release_temporary_resources()),
    ]
}

/// `release` succeeds (twice in a row), and the backend keeps working afterwards.
fn release_case<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    release: impl Fn(&B) -> FbResult<()> + Send + Sync + 'static,
) -> Case<B> {
    let x = Rng::new(2).tensor([6, 33], -2.0, 2.0);
    Case::custom(op, CaseKind::Property, format!("{op} twice, then the backend still computes"), move |b: &B| {
        let before = ok("upload", b.upload(&x))?;
        ok(op.name(), release(b))?;
        ok(op.name(), release(b))?;
        let c = ok("copy", b.copy(&before))?;
        let z = ok("zeros", b.zeros(&Shape::new([4]), DType::F32))?;
        Tolerance::EXACT.check("copy after release", &host_values(b, &c)?, &Array::from_tensor(&x))?;
        Tolerance::EXACT.check("zeros after release", &host_values(b, &z)?, &twin::zeros(&[4]))
    })
}

// ───────────────────────────── upload / to_host ─────────────────────────────

/// Host tensors of every kind: floats, ids, a block format and FP8 codes.
fn sample_tensors() -> Vec<Tensor> {
    let mut rng = Rng::new(3);
    let x = rng.tensor([33, 17], -3.0, 3.0);
    let q_bytes: Vec<u8> = (0..2 * 144).map(|_| rng.below(256) as u8).collect();
    let f8: Vec<u8> = (0..=255u8).collect();
    vec![
        x.clone(),
        Tensor::from_f32_as(&x.to_vec_f32().expect("f32"), [33, 17], DType::F16).expect("f16"),
        Tensor::from_f32_as(&x.to_vec_f32().expect("f32"), [33, 17], DType::BF16).expect("bf16"),
        rng.ids([3, 5, 7], 1000),
        Tensor::from_bytes(&q_bytes, [2, 256], DType::Q4K).expect("q4_k bytes"),
        Tensor::from_bytes(&f8, [16, 16], DType::F8E4M3).expect("f8 bytes"),
        Tensor::scalar(2.5),
    ]
}

/// `t` and `u` agree in shape, dtype and bytes.
fn same_tensor(what: &str, t: &Tensor, u: &Tensor) -> Result<(), String> {
    if t.dims() != u.dims() || t.dtype() != u.dtype() {
        return Err(format!("{what}: {:?} {} instead of {:?} {}", t.dims(), t.dtype(), u.dims(), u.dtype()));
    }
    if ok("host bytes", t.host_bytes())? != ok("host bytes", u.host_bytes())? {
        return Err(format!("{what}: bytes differ ({} {:?})", u.dtype(), u.dims()));
    }
    Ok(())
}

fn transfer_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let samples = sample_tensors();
    let samples2 = samples.clone();
    vec![
        Case::custom(
            Op::Upload,
            CaseKind::Property,
            "upload then to_host preserves shape, dtype and bytes (f32, f16, bf16, u32, q4_k, f8e4m3, scalar)",
            move |b: &B| {
                for t in &samples {
                    let up = ok("upload", b.upload(t))?;
                    if up.dims() != t.dims() || up.dtype() != t.dtype() {
                        return Err(format!(
                            "upload changed {:?} {} to {:?} {}",
                            t.dims(),
                            t.dtype(),
                            up.dims(),
                            up.dtype()
                        ));
                    }
                    let back = ok("to_host", b.to_host(&up))?;
                    same_tensor("round trip", &back, t)?;
                }
                Ok(())
            },
        ),
        Case::custom(
            Op::ToHost,
            CaseKind::Property,
            "to_host gives host tensors; on a host tensor it is the identity",
            move |b: &B| {
                for t in &samples2 {
                    let h = ok("to_host", b.to_host(t))?;
                    if !h.is_host() {
                        return Err("to_host returned a device tensor".into());
                    }
                    same_tensor("to_host of a host tensor", &h, t)?;
                    let up = ok("upload", b.upload(t))?;
                    let again = ok("to_host", b.to_host(&ok("to_host", b.to_host(&up))?))?;
                    same_tensor("to_host twice", &again, t)?;
                }
                Ok(())
            },
        ),
        Case::expect_error(Op::Upload, "upload of a tensor on a foreign device", |b: &B| {
            b.upload(&foreign_tensor(&[4, 8], DType::F32)).map(drop)
        }),
        Case::expect_error(Op::ToHost, "to_host of a tensor on a foreign device", |b: &B| {
            b.to_host(&foreign_tensor(&[4, 8], DType::F32)).map(drop)
        }),
    ]
}

// ───────────────────────────── zeros ─────────────────────────────

fn zeros_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = vec![Case::custom(
        Op::Zeros,
        CaseKind::Property,
        "zeros of every dtype: requested shape and dtype, all bytes zero ([3, 256], [], [0, 32], [300, 131] f32)",
        |b: &B| {
            let mut shapes: Vec<(Vec<usize>, DType)> = DType::ALL.iter().map(|&d| (vec![3, 256], d)).collect();
            shapes.push((vec![], DType::F32));
            shapes.push((vec![0, 32], DType::Q8_0));
            shapes.push((vec![300, 131], DType::F32));
            for (dims, dtype) in shapes {
                let z = ok("zeros", b.zeros(&Shape::new(dims.clone()), dtype))?;
                if z.dims() != dims.as_slice() || z.dtype() != dtype {
                    return Err(format!("zeros({dims:?}, {dtype}) gave {:?} {}", z.dims(), z.dtype()));
                }
                let bytes = host_bytes(b, &z)?;
                if bytes.len() != dtype.storage_bytes(dims.iter().product()) || bytes.iter().any(|&x| x != 0) {
                    return Err(format!("zeros({dims:?}, {dtype}): bytes are not all zero"));
                }
            }
            Ok(())
        },
    )];
    for (dims, dtype) in [(vec![3, 31], DType::Q8_0), (vec![2, 100], DType::Q4K), (vec![5], DType::Q6K)] {
        let name = format!("zeros({dims:?}, {dtype}): last dim not a multiple of the block");
        v.push(Case::expect_error(Op::Zeros, name, move |b: &B| b.zeros(&Shape::new(dims.clone()), dtype).map(drop)));
    }
    v
}

// ───────────────────────────── copy / copy_into ─────────────────────────────

fn copy_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(4);
    let mut v = Vec::new();
    for dims in [vec![37, 29], vec![300, 131]] {
        let x = rng.tensor(dims.clone(), -2.0, 2.0);
        v.extend(
            OpCase::new(Op::Copy, format!("copy x{dims:?}"))
                .input(Input::new(x).shape_free().dtype_free())
                .call(|b: &B, t| Ok(vec![b.copy(&t[0])?]))
                .twin(|a| vec![twin::copy(&a[0])])
                .tolerance(Tolerance::EXACT)
                .dtypes(&[DType::F32, DType::F16, DType::BF16])
                .build(),
        );
    }
    let samples = sample_tensors();
    let other = rng.tensor([33, 17], 5.0, 6.0);
    v.push(Case::custom(
        Op::Copy,
        CaseKind::Property,
        "copy is a uniquely owned, writable tensor that does not alias its source (every dtype)",
        move |b: &B| {
            for t in &samples {
                let x = ok("upload", b.upload(t))?;
                let c = ok("copy", b.copy(&x))?;
                if c.shares_storage_with(&x) || !c.is_writable() {
                    return Err(format!("copy of {} {:?} shares storage or is not writable", t.dtype(), t.dims()));
                }
                same_tensor("copy", &ok("to_host", b.to_host(&c))?, t)?;
            }
            // Writing the copy leaves the source as it was.
            let x = ok("upload", b.upload(&samples[0]))?;
            let mut c = ok("copy", b.copy(&x))?;
            ok("copy_into", b.copy_into(&mut c, &ok("upload", b.upload(&other))?))?;
            same_tensor("source after writing its copy", &ok("to_host", b.to_host(&x))?, &samples[0])?;
            same_tensor("copy after copy_into", &ok("to_host", b.to_host(&c))?, &other)
        },
    ));
    v.push(Case::expect_error(Op::Copy, "copy of a tensor on a foreign device", |b: &B| {
        b.copy(&foreign_tensor(&[3, 32], DType::F32)).map(drop)
    }));
    v
}

/// `fill` sets every element (a value exact in every float dtype, and one that rounds),
/// on sizes below and above the parallel chunk; a U32 tensor or a shared one is refused.
fn fill_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(6);
    let mut v = Vec::new();
    for (dims, value) in [(vec![3, 5], -2.5f32), (vec![300, 333], 0.1), (vec![0, 4], 1.0)] {
        v.extend(
            OpCase::new(Op::Fill, format!("fill dst{dims:?} with {value}"))
                .input(Input::new(rng.tensor(dims.clone(), -1.0, 1.0)).shape_free())
                .call(move |b: &B, t| {
                    let mut d = b.copy(&t[0])?;
                    b.fill(&mut d, value)?;
                    Ok(vec![d])
                })
                // In F16/BF16, 0.1 rounds once: the dtype's tolerance covers it.
                .twin(move |a| vec![twin::fill(&a[0], value as f64)])
                .dtypes(&[DType::F32, DType::F16, DType::BF16])
                .build(),
        );
    }
    v.push(Case::expect_error(Op::Fill, "fill a u32 tensor", |b: &B| {
        let mut ids = b.upload(&Tensor::from_vec(vec![1u32, 2, 3], [3])?)?;
        b.fill(&mut ids, 0.0)
    }));
    v.push(Case::custom(
        Op::Fill,
        CaseKind::BadInput,
        "fill a tensor with a live clone: Error::SharedStorage",
        |b: &B| {
            let mut t = b
                .upload(&Tensor::from_slice(&[1.0f32, 2.0], [2]).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            let reader = t.clone();
            match b.fill(&mut t, 0.0) {
                Err(Error::SharedStorage { .. }) => {}
                Err(e) => return Err(format!("expected Error::SharedStorage, got {e}")),
                Ok(()) => return Err("wrote through a tensor whose storage is shared".into()),
            }
            let seen = b.to_host(&reader).and_then(|h| h.to_vec_f32()).map_err(|e| e.to_string())?;
            if seen != [1.0, 2.0] {
                return Err(format!("the shared tensor changed to {seen:?}"));
            }
            Ok(())
        },
    ));
    v
}

fn copy_into_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(5);
    let mut v = Vec::new();
    for dims in [vec![19, 45], vec![257, 130]] {
        let dst = rng.tensor(dims.clone(), -1.0, 1.0);
        let src = rng.tensor(dims.clone(), -4.0, 4.0);
        v.extend(
            OpCase::new(Op::CopyInto, format!("copy_into dst{dims:?} ← src{dims:?}"))
                .input(dst)
                .input(src)
                .call(|b: &B, t| {
                    let mut d = b.copy(&t[0])?;
                    b.copy_into(&mut d, &t[1])?;
                    Ok(vec![d])
                })
                .twin(|a| vec![twin::copy(&a[1])])
                .tolerance(Tolerance::EXACT)
                .dtypes(&[DType::F32, DType::F16, DType::BF16])
                .build(),
        );
    }
    let q_src =
        Tensor::from_bytes(&(0..4 * 34).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>(), [4, 32], DType::Q8_0)
            .expect("q8_0 bytes");
    let ids = rng.ids([6, 9], 50_000);
    v.push(Case::custom(Op::CopyInto, CaseKind::Property, "copy_into of q8_0 blocks and u32 ids copies the bytes", {
        move |b: &B| {
            for src in [&q_src, &ids] {
                let mut dst = ok("zeros", b.zeros(src.shape(), src.dtype()))?;
                ok("copy_into", b.copy_into(&mut dst, &ok("upload", b.upload(src))?))?;
                same_tensor("copy_into", &ok("to_host", b.to_host(&dst))?, src)?;
            }
            Ok(())
        }
    }));
    let src = rng.tensor([8, 24], -1.0, 1.0);
    let src2 = src.clone();
    v.push(Case::custom(
        Op::CopyInto,
        CaseKind::Property,
        "copy_into refuses a destination with a live clone (Error::SharedStorage) and leaves it unchanged",
        move |b: &B| {
            let mut dst = ok("zeros", b.zeros(src.shape(), DType::F32))?;
            let alias = dst.clone();
            match b.copy_into(&mut dst, &ok("upload", b.upload(&src))?) {
                Err(Error::SharedStorage { .. }) => {}
                Err(e) => return Err(format!("refused with {e:?} instead of Error::SharedStorage")),
                Ok(()) => return Err("wrote through a tensor whose storage another handle sees".into()),
            }
            Tolerance::EXACT.check(
                "the clone after the refused write",
                &host_values(b, &alias)?,
                &twin::zeros(&[8, 24]),
            )?;
            drop(alias);
            ok("copy_into once the clone is gone", b.copy_into(&mut dst, &ok("upload", b.upload(&src))?))
        },
    ));
    v.push(Case::custom(
        Op::CopyInto,
        CaseKind::Property,
        "copy_into a part of a partitioned allocation writes only that part",
        move |b: &B| {
            if b.uses_device_storage() {
                return Ok(()); // partitions are host allocations; device backends own their layouts
            }
            let big = ok("zeros", b.zeros(&Shape::new([600]), DType::F32))?;
            let mut parts =
                ok("partition", big.partition(&[Shape::new([8, 24]), Shape::new([8, 24]), Shape::new([100])]))?;
            ok("copy_into a part", b.copy_into(&mut parts[1], &src2))?;
            Tolerance::EXACT.check("part 0", &host_values(b, &parts[0])?, &twin::zeros(&[8, 24]))?;
            Tolerance::EXACT.check("part 1", &host_values(b, &parts[1])?, &Array::from_tensor(&src2))?;
            Tolerance::EXACT.check("part 2", &host_values(b, &parts[2])?, &twin::zeros(&[100]))
        },
    ));
    v.push(Case::expect_error(Op::CopyInto, "copy_into from a tensor on a foreign device", |b: &B| {
        let mut dst = b.zeros(&Shape::new([4, 8]), DType::F32)?;
        b.copy_into(&mut dst, &foreign_tensor(&[4, 8], DType::F32))
    }));
    v
}

// ───────────────────────────── cast ─────────────────────────────

/// Values that exercise rounding: exact ties between neighbours of the target format
/// (both parities), subnormals, overflow and signed zeros.
fn rounding_probe(mantissa_bits: i32, max_finite: f32) -> Vec<f32> {
    let mut v = vec![0.0, -0.0, 1.0, -1.0, max_finite, -max_finite, max_finite * 1.0001, 1e-7, 3e-8, -2.9e-8, 1e-40];
    for e in [-20, -14, -3, 0, 5, 15] {
        for m in 0..6 {
            // 1 + (2m + 1)/2^(bits+1): halfway between two neighbours, odd then even below.
            let base = 2f32.powi(e);
            let tie = base * (1.0 + (2 * m + 1) as f32 / 2f32.powi(mantissa_bits + 1));
            v.push(tie);
            v.push(-tie);
        }
    }
    v
}

fn cast_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(6);
    let mut v = Vec::new();
    let x = rng.tensor([29, 37], -70.0, 70.0);
    let big = rng.tensor([200, 171], -3.0, 3.0);
    for (target, dims) in [(DType::F16, "[29, 37]"), (DType::BF16, "[29, 37]"), (DType::F16, "[200, 171]")] {
        let t = if dims == "[29, 37]" { x.clone() } else { big.clone() };
        v.extend(
            OpCase::new(Op::Cast, format!("cast x{dims} to {target}"))
                .input(Input::new(t).shape_free())
                .call(move |b: &B, t| Ok(vec![b.cast(&t[0], target)?]))
                .twin(move |a| {
                    vec![if target == DType::F16 { twin::cast_to_f16(&a[0]) } else { twin::cast_to_bf16(&a[0]) }]
                })
                .tolerance(Tolerance::EXACT)
                .dtypes(&[DType::F32, DType::F16, DType::BF16])
                .build(),
        );
    }
    v.extend(
        OpCase::new(Op::Cast, "cast x[29, 37] to f32 (exact)")
            .input(Input::new(x.clone()).shape_free().dtype_free())
            .call(|b: &B, t| Ok(vec![b.cast(&t[0], DType::F32)?]))
            .twin(|a| vec![twin::copy(&a[0])])
            .tolerance(Tolerance::EXACT)
            .dtypes(&[DType::F32, DType::F16, DType::BF16])
            .no_bad_inputs()
            .build(),
    );
    for (target, bits, max) in [(DType::F16, 10, 65504.0f32), (DType::BF16, 7, f32::MAX)] {
        let probe = rounding_probe(bits, max);
        let n = probe.len();
        let t = Tensor::from_vec(probe, [n]).expect("probe");
        v.push(forward_case(
            Op::Cast,
            format!("cast f32 ties, subnormals and overflow [{n}] to {target}: nearest even"),
            vec![t],
            target,
            Tolerance::EXACT,
            move |b: &B, t| b.cast(&t[0], target),
            move |t| {
                let a = Array::from_tensor(&t[0]);
                if target == DType::F16 {
                    twin::cast_to_f16(&a)
                } else {
                    twin::cast_to_bf16(&a)
                }
            },
        ));
    }
    let ids: Vec<u32> = (0..777).map(|i| if i == 776 { 1 << 24 } else { (i * 9973) % 100_000 }).collect();
    let ids = Tensor::from_vec(ids, [777]).expect("ids");
    v.extend(
        OpCase::new(Op::Cast, "cast u32 ids[777] (up to 2^24) to f32")
            .input(Input::new(ids).shape_free().dtype_free())
            .call(|b: &B, t| Ok(vec![b.cast(&t[0], DType::F32)?]))
            .twin(|a| vec![twin::copy(&a[0])])
            .tolerance(Tolerance::EXACT)
            .build(),
    );
    let integral: Vec<f32> = (0..40_000).map(|i| ((i * 7919) % 1_000_003) as f32).collect();
    let integral = Tensor::from_vec(integral, [200, 200]).expect("integral");
    v.extend(
        OpCase::new(Op::Cast, "cast integral f32[200, 200] to u32")
            .input(Input::new(integral).shape_free().dtype_free())
            .call(|b: &B, t| {
                let out = b.cast(&t[0], DType::U32)?;
                if out.dtype() != DType::U32 {
                    return Err(Error::dtype("cast", "output", DType::U32, out.dtype()));
                }
                Ok(vec![out])
            })
            .twin(|a| vec![twin::copy(&a[0])])
            .tolerance(Tolerance::EXACT)
            .build(),
    );
    v.push(Case::custom(
        Op::Cast,
        CaseKind::Property,
        "every f16 and every bf16 value survives a cast to f32 and back bit for bit",
        |b: &B| {
            let f16s: Vec<half::f16> = (0..=u16::MAX).map(half::f16::from_bits).filter(|h| !h.is_nan()).collect();
            let bf16s: Vec<half::bf16> = (0..=u16::MAX).map(half::bf16::from_bits).filter(|h| !h.is_nan()).collect();
            let (n16, nb16) = (f16s.len(), bf16s.len());
            let t16 = ok("tensor", Tensor::from_vec(f16s, [n16]))?;
            let tb16 = ok("tensor", Tensor::from_vec(bf16s, [nb16]))?;
            for t in [t16, tb16] {
                let wide = ok("cast to f32", b.cast(&ok("upload", b.upload(&t))?, DType::F32))?;
                let back = ok("cast back", b.cast(&wide, t.dtype()))?;
                same_tensor("round trip", &ok("to_host", b.to_host(&back))?, &t)?;
            }
            Ok(())
        },
    ));
    let bad_values: [(&str, f32); 5] = [
        ("negative", -1.0),
        ("fractional", 2.5),
        ("NaN", f32::NAN),
        ("above u32::MAX", 5e9),
        ("infinite", f32::INFINITY),
    ];
    for (what, value) in bad_values {
        v.push(Case::expect_error(Op::Cast, format!("cast f32 → u32 of a {what} value ({value})"), move |b: &B| {
            let t = b.upload(&Tensor::from_vec(vec![1.0f32, value, 3.0], [3])?)?;
            b.cast(&t, DType::U32).map(drop)
        }));
    }
    v.push(Case::expect_error(Op::Cast, "cast u32 → f32 of 2^24 + 1 (not exactly representable)", |b: &B| {
        let t = b.upload(&Tensor::from_vec(vec![5u32, (1 << 24) + 1], [2])?)?;
        b.cast(&t, DType::F32).map(drop)
    }));
    let q = Tensor::zeros([2, 32], DType::Q8_0).expect("zeros");
    let f8 = Tensor::zeros([2, 3], DType::F8E4M3).expect("zeros");
    let pairs: [(&str, Tensor, DType); 5] = [
        ("f32 → q8_0 (use quantize)", x.clone(), DType::Q8_0),
        ("f16 → u32", Tensor::from_f32_as(&[1.0, 2.0], [2], DType::F16).expect("f16"), DType::U32),
        ("q8_0 → f32 (use dequantize)", q, DType::F32),
        ("f8e4m3 → f32 (use f8e4m3_to_f32)", f8, DType::F32),
        ("u32 → bf16", Tensor::from_vec(vec![1u32, 2], [2]).expect("ids"), DType::BF16),
    ];
    for (what, t, target) in pairs {
        v.push(Case::expect_error(Op::Cast, format!("cast {what}"), move |b: &B| {
            b.cast(&b.upload(&t)?, target).map(drop)
        }));
    }
    v
}

// ───────────────────────────── preprocess_linear_weight ─────────────────────────────

fn preprocess_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(7);
    let x = rng.tensor([5, 256], -1.0, 1.0);
    let w_f32 = rng.tensor([24, 40], -1.0, 1.0);
    let w_float = rng.tensor([12, 256], -1.0, 1.0);
    vec![
        Case::custom(
            Op::PreprocessLinearWeight,
            CaseKind::Property,
            "preprocess_linear_weight keeps the logical shape; quantized_matmul gives the same result with it (q8_0, q4_k)",
            move |b: &B| {
                let pre = ok("preprocess_linear_weight", b.preprocess_linear_weight(&ok("upload", b.upload(&w_f32))?))?;
                if pre.dims() != w_f32.dims() {
                    return Err(format!("f32 weight [24, 40] became {:?}", pre.dims()));
                }
                let xu = ok("upload", b.upload(&x))?;
                for dtype in [DType::Q8_0, DType::Q4K] {
                    let w = ok("quantize", b.quantize(&ok("upload", b.upload(&w_float))?, dtype))?;
                    let pre = ok("preprocess_linear_weight", b.preprocess_linear_weight(&w))?;
                    if pre.dims() != w.dims() {
                        return Err(format!("{dtype} weight {:?} became {:?}", w.dims(), pre.dims()));
                    }
                    let want = host_values(b, &ok("quantized_matmul", b.quantized_matmul(&xu, &w))?)?;
                    let got = host_values(b, &ok("quantized_matmul", b.quantized_matmul(&xu, &pre))?)?;
                    Tolerance::F32.check(&format!("{dtype}: x · preprocessed Wᵀ vs x · Wᵀ"), &got, &want)?;
                }
                Ok(())
            },
        ),
        Case::expect_error(Op::PreprocessLinearWeight, "preprocess_linear_weight of a rank-3 weight", |b: &B| {
            b.preprocess_linear_weight(&b.zeros(&Shape::new([2, 3, 4]), DType::F32)?).map(drop)
        }),
        Case::expect_error(Op::PreprocessLinearWeight, "preprocess_linear_weight of a rank-1 weight", |b: &B| {
            b.preprocess_linear_weight(&b.zeros(&Shape::new([64]), DType::Q8_0)?).map(drop)
        }),
        Case::expect_error(Op::PreprocessLinearWeight, "preprocess_linear_weight of u32 ids", |b: &B| {
            b.preprocess_linear_weight(&b.zeros(&Shape::new([4, 4]), DType::U32)?).map(drop)
        }),
    ]
}

// ───────────────────────────── FP8 E4M3 ─────────────────────────────

/// One of the `f8e4m3_to_*` methods.
type DecodeFn<B> = fn(&B, &Tensor) -> FbResult<Tensor>;

fn f8_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let all: Vec<u8> = (0..=255u8).collect();
    let all = Tensor::from_bytes(&all, [256], DType::F8E4M3).expect("codes");
    let mut rng = Rng::new(8);
    let many: Vec<u8> = (0..300 * 130).map(|_| rng.below(256) as u8).collect();
    let many = Tensor::from_bytes(&many, [300, 130], DType::F8E4M3).expect("codes");
    let ops: [(Op, DType, DecodeFn<B>); 3] = [
        (Op::F8e4m3ToF32, DType::F32, |b, t| b.f8e4m3_to_f32(t)),
        (Op::F8e4m3ToF16, DType::F16, |b, t| b.f8e4m3_to_f16(t)),
        (Op::F8e4m3ToBf16, DType::BF16, |b, t| b.f8e4m3_to_bf16(t)),
    ];
    let mut v = Vec::new();
    for (op, out, decode) in ops {
        for (what, t) in [("all 256 codes", &all), ("random codes [300, 130]", &many)] {
            v.push(forward_case(
                op,
                format!("{op}: {what}, exact (NaN for 0x7f/0xff)"),
                vec![t.clone()],
                out,
                Tolerance::EXACT,
                move |b: &B, t| decode(b, &t[0]),
                |t| twin::f8e4m3_decode(t[0].host_bytes().expect("host codes"), t[0].dims()),
            ));
        }
        for (what, dtype) in [("f32", DType::F32), ("u32", DType::U32), ("q8_0", DType::Q8_0)] {
            v.push(Case::expect_error(op, format!("{op} of a {what} tensor"), move |b: &B| {
                decode(b, &b.zeros(&Shape::new([2, 32]), dtype)?).map(drop)
            }));
        }
    }
    v
}
