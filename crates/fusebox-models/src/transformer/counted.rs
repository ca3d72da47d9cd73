//! The loss and its gradients when few positions count (fine-tuning on chat data, where
//! only the assistant's tokens carry loss): the output head `logits = h·Wheadᵀ` and the
//! cross-entropy run on the counted rows of h only.
//!
//! With `c` counted positions of `n = B·T`, `loss = mean_{i counted} CE(h_i·Wheadᵀ, t_i)`
//! depends on h only through those rows, so `dh` is zero elsewhere: gathering the rows
//! (`index_select`), running the head and the cross-entropy on `[c, D]`, and scattering
//! `dh` back (`scatter_add_rows` into zeros) gives the dense path's loss and gradients
//! while the head's three matmuls and the softmax shrink by `n / c` (a 49k-token
//! vocabulary makes the head the largest matmul of a small model).

use fusebox::{ComputeBackend, DType, Result, Shape, Tensor};

use super::checkpointing::Keep;
use super::{GradsReady, LossOptions, Sink, Transformer};

impl Transformer {
    /// [`loss_and_grads_with`](Transformer::loss_and_grads_with) (or, with a LoRA sink,
    /// [`lora_loss_and_grads`](Transformer::lora_loss_and_grads)) over the counted rows
    /// only, when `ignore` is set and at most half the positions count; `None` (nothing
    /// done) otherwise, and the caller runs the dense path.
    pub(super) fn counted_loss_and_grads(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        opts: LossOptions,
        sink: &mut Sink<'_>,
        ready: &mut GradsReady<'_>,
    ) -> Result<Option<f32>> {
        let LossOptions { ignore, grad_scale, activations } = opts;
        let Some(ignore) = ignore else { return Ok(None) };
        if targets.dtype() != DType::U32 {
            return Ok(None); // the dense path reports the error
        }
        let all = b.to_host(targets)?.to_vec::<u32>()?;
        let rows: Vec<u32> = (0..all.len()).filter(|&i| all[i] != ignore).map(|i| i as u32).collect();
        if rows.is_empty() || rows.len() * 2 > all.len() || all.len() > u32::MAX as usize {
            return Ok(None);
        }
        let mut cache = self.forward_trunk(b, ids, Keep::from(activations))?;
        let aux = self.router_aux_loss(b, &mut cache.layers, grad_scale)?;
        let (n, d, c) = (cache.batch * cache.seq, self.arch.d_model, rows.len());
        if n != all.len() {
            return Ok(None); // targets do not match ids: the dense path reports it
        }
        let counted: Vec<u32> = rows.iter().map(|&i| all[i as usize]).collect();
        let rows = b.upload(&Tensor::from_vec(rows, [c])?)?;
        let h = b.index_select(&cache.norm_f.output.reshape([n, d])?, &rows)?;
        let head = self.index.head_weight();
        let logits = self.linear(b, &h, head, None)?;
        let ce = b.cross_entropy(&logits, &b.upload(&Tensor::from_vec(counted, [c])?)?, None)?;
        let loss = b.to_host(&ce.loss)?.to_vec::<f32>()?[0];
        drop(logits);
        let d_logits = match ce.d_logits {
            d if grad_scale == 1.0 => d,
            d => b.mul_scalar(&d, grad_scale)?,
        };
        let dh = self.linear_grad(b, sink, &h, (head, None), &d_logits)?;
        let mut dhf = b.zeros(&Shape::new(vec![n, d]), DType::F32)?;
        b.scatter_add_rows(&mut dhf, &rows, &dh)?;
        self.backward_below_head(b, cache, &dhf, sink, ready)?;
        Ok(Some(loss + aux))
    }
}

#[cfg(test)]
mod tests {
    use fusebox::{CpuBackend, Tensor};

    use crate::config::{ModelConfig, Style};
    use crate::model::arch_of;
    use crate::params::ParamSet;
    use crate::transformer::Transformer;

    /// The counted-rows path gives the dense path's loss and gradients (Llama: tied
    /// head; Gemma 3: embedding scale, post norms).
    #[test]
    fn counted_rows_match_the_dense_loss_and_gradients() {
        for style in [Style::Llama, Style::Gemma3] {
            check(style);
        }
    }

    fn check(style: Style) {
        let b = CpuBackend::builder().threads(2).build().unwrap();
        let net = Transformer::new(&b, arch_of(&ModelConfig::tiny(style, 64, 16)), 7).unwrap();
        let (bsz, t) = (2, 6);
        let v = net.arch.vocab_size as u32;
        let ids: Vec<u32> = (0..(bsz * t) as u32).map(|i| (i * 7 + 3) % v).collect();
        const IGNORE: u32 = u32::MAX;
        // Counted: 3 of 12 positions (the counted path), then every position (dense).
        let sparse: Vec<u32> =
            (0..(bsz * t) as u32).map(|i| if i % 4 == 3 { (i * 5 + 1) % v } else { IGNORE }).collect();
        let ids_t = Tensor::from_vec(ids, [bsz, t]).unwrap();
        let targets_t = Tensor::from_vec(sparse.clone(), [bsz, t]).unwrap();
        let mut g_counted = ParamSet::zeros(&b, &net.specs).unwrap();
        let loss_counted = net.loss_and_grads(&b, &ids_t, &targets_t, Some(IGNORE), 0.5, &mut g_counted).unwrap();
        // The dense path: cross-entropy over all logits with the ignore index.
        let (logits, cache) = net.forward(&b, &ids_t).unwrap();
        let ce =
            fusebox::ComputeBackend::cross_entropy(&b, &logits, &targets_t.reshape([bsz * t]).unwrap(), Some(IGNORE))
                .unwrap();
        let loss_dense = ce.loss.to_vec::<f32>().unwrap()[0];
        let d_logits = fusebox::ComputeBackend::mul_scalar(&b, &ce.d_logits, 0.5).unwrap();
        let mut g_dense = ParamSet::zeros(&b, &net.specs).unwrap();
        net.backward(&b, cache, &d_logits, &mut g_dense).unwrap();
        assert!((loss_counted - loss_dense).abs() <= 1e-6 * loss_dense.abs(), "{loss_counted} vs {loss_dense}");
        for ((s, gc), gd) in net.specs.iter().zip(&g_counted.tensors).zip(&g_dense.tensors) {
            let (gc, gd) = (gc.to_vec_f32().unwrap(), gd.to_vec_f32().unwrap());
            let scale = gd.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-6);
            let worst = gc.iter().zip(&gd).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst <= 1e-5 * scale, "{style:?} {}: max |Δ| {worst} of max |g| {scale}", s.name);
        }
        assert!(g_counted.tensors.iter().any(|g| g.to_vec_f32().unwrap().iter().any(|&x| x != 0.0)));
    }

    /// LoRA through the counted rows: the adapters' gradients equal the dense path's
    /// (a frozen base, B ≠ 0 so every adapter term is live).
    #[test]
    fn counted_rows_match_the_dense_lora_gradients() {
        use crate::rng::Rng;
        use crate::transformer::{Adapters, LoraConfig, Sink};

        let b = CpuBackend::builder().threads(2).build().unwrap();
        let mut net = Transformer::new(&b, arch_of(&ModelConfig::tiny(Style::Llama, 64, 16)), 3).unwrap();
        let mut ad = Adapters::init(&b, &net.arch, LoraConfig::new(2), 4).unwrap();
        let mut rng = Rng::new(5);
        for i in 0..ad.sites().len() {
            let t = &mut ad.params.tensors[2 * i + 1];
            let v = rng.uniform_vec(t.elem_count(), -0.3, 0.3);
            fusebox::ComputeBackend::copy_into(&b, t, &Tensor::from_vec(v, t.shape().clone()).unwrap()).unwrap();
        }
        net.attach_lora(ad).unwrap();
        let (bsz, t) = (2, 6);
        let v = net.arch.vocab_size as u32;
        const IGNORE: u32 = u32::MAX;
        let ids: Vec<u32> = (0..(bsz * t) as u32).map(|i| (i * 11 + 2) % v).collect();
        let sparse: Vec<u32> =
            (0..(bsz * t) as u32).map(|i| if i % 5 == 4 { (i * 3 + 1) % v } else { IGNORE }).collect();
        let ids_t = Tensor::from_vec(ids, [bsz, t]).unwrap();
        let targets_t = Tensor::from_vec(sparse, [bsz, t]).unwrap();
        let specs = net.lora.as_ref().unwrap().specs.clone();
        let mut g_counted = ParamSet::zeros(&b, &specs).unwrap();
        let loss_counted = net.lora_loss_and_grads(&b, &ids_t, &targets_t, Some(IGNORE), 1.0, &mut g_counted).unwrap();
        // Dense: logits everywhere, cross-entropy with the ignore index, the LoRA backward.
        let (logits, cache) = net.forward(&b, &ids_t).unwrap();
        let ce =
            fusebox::ComputeBackend::cross_entropy(&b, &logits, &targets_t.reshape([bsz * t]).unwrap(), Some(IGNORE))
                .unwrap();
        let loss_dense = ce.loss.to_vec::<f32>().unwrap()[0];
        let mut g_dense = ParamSet::zeros(&b, &specs).unwrap();
        net.backward_impl(
            &b,
            cache,
            &ce.d_logits,
            &mut Sink::Lora(&mut g_dense),
            &mut crate::transformer::NotListening,
        )
        .unwrap();
        assert!((loss_counted - loss_dense).abs() <= 1e-6 * loss_dense.abs(), "{loss_counted} vs {loss_dense}");
        for ((s, gc), gd) in specs.iter().zip(&g_counted.tensors).zip(&g_dense.tensors) {
            let (gc, gd) = (gc.to_vec_f32().unwrap(), gd.to_vec_f32().unwrap());
            let scale = gd.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-6);
            let worst = gc.iter().zip(&gd).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst <= 1e-5 * scale, "{}: max |Δ| {worst} of max |g| {scale}", s.name);
        }
        assert!(g_counted.tensors.iter().all(|g| g.to_vec_f32().unwrap().iter().any(|&x| x != 0.0)));
    }
}
