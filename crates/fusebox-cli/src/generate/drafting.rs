//! Speculative decoding's setup for `generate` and `bench generate`: the draft model,
//! checked against the model's vocabulary, and the drafted/accepted counts as JSON.

use fusebox::{ComputeBackend, Result};
use fusebox_models::generate::speculative::check_same_vocabulary;
use fusebox_models::generate::{DraftStats, Drafter};
use fusebox_models::pretrained::Pretrained;
use serde_json::{json, Value};

use super::args::DraftArgs;

/// The model `--draft-model` names, loaded and checked to share `target`'s tokenizer
/// (`None` without the flag).
pub(crate) fn load_draft_model(
    b: &dyn ComputeBackend,
    args: &DraftArgs,
    target: &Pretrained,
) -> Result<Option<Pretrained>> {
    let Some(path) = &args.draft_model else { return Ok(None) };
    let draft = fusebox_models::open::load(b, path)?;
    check_same_vocabulary(&target.tokenizer, &draft.tokenizer).map_err(|e| {
        fusebox::Error::unsupported(
            "--draft-model",
            format!("{} cannot draft for {}: {e}", path.display(), target.path.display()),
        )
    })?;
    Ok(Some(draft))
}

/// The drafter the flags describe: `draft` (loaded by [`load_draft_model`]) or prompt
/// lookup; `None` without drafting.
pub(crate) fn drafter<'m>(
    b: &dyn ComputeBackend,
    args: &DraftArgs,
    draft: Option<&'m Pretrained>,
    vocab: usize,
    ctx: usize,
    cache_type: fusebox::DType,
) -> Result<Option<Drafter<'m>>> {
    match (draft, args.draft_ngram) {
        (Some(m), _) => Ok(Some(Drafter::model(b, &m.network, vocab, ctx, cache_type, args.max_draft())?)),
        (None, Some(n)) => Ok(Some(Drafter::ngram(n, args.max_draft())?)),
        (None, None) => Ok(None),
    }
}

/// `{"kind", "max_draft", "drafted_tokens", "accepted_tokens", "acceptance_rate",
/// "verify_passes"}`, or null without drafting.
pub(crate) fn draft_json(drafter: Option<&Drafter<'_>>, stats: &DraftStats) -> Value {
    match drafter {
        None => Value::Null,
        Some(d) => json!({
            "kind": d.kind(),
            "max_draft": d.max_draft(),
            "drafted_tokens": stats.drafted,
            "accepted_tokens": stats.accepted,
            "acceptance_rate": stats.acceptance_rate(),
            "verify_passes": stats.passes,
        }),
    }
}
