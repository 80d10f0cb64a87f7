//! Ops whose constant operands (frozen weights, rotary tables, masks) stay out of the graph:
//! [`frozen_linear`], [`mul_const`], [`add_const`].
//!
//! candle's own backward computes a gradient for every operand of a tracked op, trainable or
//! not, which for a frozen weight is a full `[out, in]` gemm per call. Each op here has the
//! variable operand as its only graph input, so backward computes that operand's gradient
//! only. The forward is candle's own op on the storage, on whatever device the tensors live,
//! so the values are bit-identical to candle's.

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, Layout, MetalStorage, Result, Shape, Storage, Tensor,
};

static FROZEN_OPS: AtomicBool = AtomicBool::new(true);

/// Turns the constant-operand ops ([`frozen_linear`], [`mul_const`], [`add_const`]) on or off
/// for the whole process (on by default). Off, frozen weights, rotary tables and masks go
/// through candle's ops, whose backward also computes (and discards) their gradients: only for
/// A/B measurements (`examples/fwd_bwd_bench.rs --no-frozen-op`).
pub fn set_frozen_ops(enabled: bool) {
    FROZEN_OPS.store(enabled, Ordering::Relaxed);
}

/// Whether [`set_frozen_ops`] left the constant-operand ops on.
pub fn frozen_ops_enabled() -> bool {
    FROZEN_OPS.load(Ordering::Relaxed)
}

/// `x [m, k] @ w [n, k]^T (+ bias [n]) -> [m, n]` where `w` and `bias` are constants: the op's
/// only graph input is `x`, so backward computes `dx = dy @ w` and neither `dw` (an `[n, k]`
/// gemm and allocation per call) nor a bias gradient, and the gradient store holds nothing for
/// them. candle's own matmul would compute both, needed or not.
///
/// The forward is candle's matmul on the storage (the same gemm call `x.matmul(&w.t())` makes,
/// so results are bit-identical), on whatever device the tensors live.
pub fn frozen_linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let (n, k2) = w.dims2()?;
    if k != k2 {
        candle_core::bail!("frozen_linear: x is [{m}, {k}] but the weight is [{n}, {k2}]");
    }
    let op = FrozenLinear {
        weight: w.detach(),
        bias: bias.map(Tensor::detach),
    };
    x.apply_op1(op)
}

/// The custom op behind [`frozen_linear`]: captures the constant weight and bias.
struct FrozenLinear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl FrozenLinear {
    /// `x @ w^T (+ b)` on one backend's storage.
    fn fwd<S: BackendStorage>(
        x: &S,
        xl: &Layout,
        w: (&S, &Layout),
        bias: Option<(&S, &Layout)>,
    ) -> candle_core::Result<(S, Shape)> {
        let (m, k) = xl.shape().dims2()?;
        let n = w.1.dims()[0];
        let wt = w.1.transpose(0, 1)?;
        let y = x.matmul(w.0, (1, m, n, k), xl, &wt)?;
        let y = match bias {
            Some((b, bl)) => y.binary_impl::<candle_core::op::Add>(
                b,
                &Layout::contiguous((m, n)),
                &bl.broadcast_as((m, n))?,
            )?,
            None => y,
        };
        Ok((y, Shape::from((m, n))))
    }
}

/// Borrows the storage of `$t` as the `$variant` backend or fails with the op's name.
macro_rules! backend_storage {
    ($guard:expr, $variant:ident) => {
        match &*$guard {
            Storage::$variant(s) => s,
            _ => candle_core::bail!("constant operand and input on different devices"),
        }
    };
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(&self, x: &CpuStorage, xl: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("frozen-linear fwd");
        let (wg, wl) = self.weight.storage_and_layout();
        let w = backend_storage!(wg, Cpu);
        match &self.bias {
            Some(b) => {
                let (bg, bl) = b.storage_and_layout();
                Self::fwd(x, xl, (w, wl), Some((backend_storage!(bg, Cpu), bl)))
            }
            None => Self::fwd(x, xl, (w, wl), None),
        }
    }

    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (wg, wl) = self.weight.storage_and_layout();
        let w = backend_storage!(wg, Cuda);
        match &self.bias {
            Some(b) => {
                let (bg, bl) = b.storage_and_layout();
                Self::fwd(x, xl, (w, wl), Some((backend_storage!(bg, Cuda), bl)))
            }
            None => Self::fwd(x, xl, (w, wl), None),
        }
    }

    fn metal_fwd(
        &self,
        x: &MetalStorage,
        xl: &Layout,
    ) -> candle_core::Result<(MetalStorage, Shape)> {
        let (wg, wl) = self.weight.storage_and_layout();
        let w = backend_storage!(wg, Metal);
        match &self.bias {
            Some(b) => {
                let (bg, bl) = b.storage_and_layout();
                Self::fwd(x, xl, (w, wl), Some((backend_storage!(bg, Metal), bl)))
            }
            None => Self::fwd(x, xl, (w, wl), None),
        }
    }

    /// `dx = dy @ w`, the same product candle's matmul backward computes for its left operand.
    fn bwd(&self, _x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let _t = crate::op_time::span("frozen-linear bwd");
        Ok(Some(dy.contiguous()?.matmul(&self.weight)?))
    }
}

/// `x * c`, `c` broadcast to `x`'s shape, for a constant `c` (frozen norm weight, rotary
/// table): when `x` tracks a graph and `c` does not, the op's only graph input is `x`, so
/// backward computes `dx = dy * c` and not the `x`-sized gradient of `c`'s broadcast view
/// (candle's `broadcast_mul` computes and keeps it). Same values as `x.broadcast_mul(c)`.
pub fn mul_const(x: &Tensor, c: &Tensor) -> Result<Tensor> {
    const_binary(x, c, ConstOp::Mul)
}

/// `x + c`, `c` broadcast to `x`'s shape, for a constant `c` (attention mask): as [`mul_const`],
/// backward passes `dy` to `x` only. Same values as `x.broadcast_add(c)`.
pub fn add_const(x: &Tensor, c: &Tensor) -> Result<Tensor> {
    const_binary(x, c, ConstOp::Add)
}

#[derive(Debug, Clone, Copy)]
enum ConstOp {
    Mul,
    Add,
}

/// Whether `small` broadcasts to `big` (numpy rules) without `big` growing.
fn broadcasts_to(small: &[usize], big: &[usize]) -> bool {
    small.len() <= big.len()
        && small
            .iter()
            .rev()
            .zip(big.iter().rev())
            .all(|(&s, &b)| s == b || s == 1)
}

fn const_binary(x: &Tensor, c: &Tensor, op: ConstOp) -> Result<Tensor> {
    let custom = x.track_op()
        && !c.track_op()
        && frozen_ops_enabled()
        && x.dtype() == c.dtype()
        && broadcasts_to(c.dims(), x.dims());
    if !custom {
        return match op {
            ConstOp::Mul => x.broadcast_mul(c),
            ConstOp::Add => x.broadcast_add(c),
        };
    }
    x.apply_op1(ConstBinary { c: c.detach(), op })
}

/// The custom op behind [`mul_const`] / [`add_const`]: captures the constant.
struct ConstBinary {
    c: Tensor,
    op: ConstOp,
}

impl ConstBinary {
    fn fwd<S: BackendStorage>(
        &self,
        x: &S,
        xl: &Layout,
        c: (&S, &Layout),
    ) -> candle_core::Result<(S, Shape)> {
        let cl = c.1.broadcast_as(xl.shape().clone())?;
        let y = match self.op {
            ConstOp::Mul => x.binary_impl::<candle_core::op::Mul>(c.0, xl, &cl)?,
            ConstOp::Add => x.binary_impl::<candle_core::op::Add>(c.0, xl, &cl)?,
        };
        Ok((y, xl.shape().clone()))
    }
}

impl CustomOp1 for ConstBinary {
    fn name(&self) -> &'static str {
        match self.op {
            ConstOp::Mul => "mul-const",
            ConstOp::Add => "add-const",
        }
    }

    fn cpu_fwd(&self, x: &CpuStorage, xl: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("const-binary fwd");
        let (cg, cl) = self.c.storage_and_layout();
        self.fwd(x, xl, (backend_storage!(cg, Cpu), cl))
    }

    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (cg, cl) = self.c.storage_and_layout();
        self.fwd(x, xl, (backend_storage!(cg, Cuda), cl))
    }

    fn metal_fwd(
        &self,
        x: &MetalStorage,
        xl: &Layout,
    ) -> candle_core::Result<(MetalStorage, Shape)> {
        let (cg, cl) = self.c.storage_and_layout();
        self.fwd(x, xl, (backend_storage!(cg, Metal), cl))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let _t = crate::op_time::span("const-binary bwd");
        Ok(Some(match self.op {
            ConstOp::Mul => dy.broadcast_mul(&self.c)?,
            ConstOp::Add => dy.clone(),
        }))
    }
}
