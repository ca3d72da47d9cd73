//! `ChatSession` on SmolLM2: a second turn that runs only its new tokens after the
//! cache answers exactly as a fresh cache given the whole rendered conversation does
//! (greedy). Skips, saying why, without models/SmolLM2-135M-Instruct.Q4_1.gguf
//! (scripts/fetch-smollm2.sh fetches it). And on a tiny model: a turn that fails
//! leaves the conversation as it was.

#[path = "common/mod.rs"]
mod common;
#[path = "../../fusebox-cli/tests/tiny_model/mod.rs"]
mod tiny_model;

use std::path::Path;

use fusebox::CpuBackend;
use fusebox_models::pretrained::chat::{ChatOptions, ChatSession, TurnEnd};
use fusebox_models::{open, pretrained};
use fusebox_models::{Sampler, SamplerConfig};

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig { temperature: 0.0, ..SamplerConfig::default() }).unwrap()
}

#[test]
fn the_second_turn_on_the_cache_answers_as_a_full_prefill_does() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("skipping: {} not found (scripts/fetch-smollm2.sh fetches it)", path.display());
        return;
    }
    let b = CpuBackend::builder().threads(2).build().unwrap();
    let model = open::load(&b, &path).unwrap();
    let options = ChatOptions { ctx_size: 512, max_tokens: 24, context_shift: false };
    let mut chat = ChatSession::new(&model, &b, Some("Answer in one sentence."), options).unwrap();
    let mut streamed = String::new();
    let first = chat.answer("What is the capital of France?", &mut greedy(), &|| false, &mut |t| {
        streamed.push_str(t);
        Ok(())
    });
    let first = first.unwrap();
    assert_eq!(streamed, first.reply);
    assert_eq!(first.end, TurnEnd::StopToken);
    let second = chat.answer("And of Italy?", &mut greedy(), &|| false, &mut |_| Ok(())).unwrap();
    assert_eq!((second.restarted, second.reused), (None, first.prompt_tokens + first.tokens.len()), "{second:?}");

    // The same conversation from an empty cache, in one prefill.
    let template = model.chat_template().unwrap();
    let text = template
        .apply(
            &[
                ("system", "Answer in one sentence."),
                ("user", "What is the capital of France?"),
                ("assistant", &first.reply),
                ("user", "And of Italy?"),
            ],
            true,
        )
        .unwrap();
    let prompt = template.encode(&model.tokenizer, &text);
    assert_eq!(prompt.len(), second.prompt_tokens);
    let mut session = model.session(&b, 512).unwrap();
    let stop = model.stop_ids(true);
    let g = pretrained::generate(&mut session, &b, &prompt, 24, &mut greedy(), &stop, |_| Ok(())).unwrap();
    let fresh: Vec<u32> = g.tokens.into_iter().filter(|t| !stop.contains(t)).collect();
    assert_eq!(second.tokens, fresh, "{:?} vs {:?}", second.reply, model.tokenizer.decode(&fresh));
}

#[test]
fn a_failed_turn_leaves_the_conversation_and_the_next_turn_restarts_the_cache() {
    let path = tiny_model::tiny_gguf(4096);
    let b = CpuBackend::builder().threads(1).build().unwrap();
    let model = open::load(&b, &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let options = ChatOptions { ctx_size: 256, max_tokens: 3, context_shift: false };
    let mut chat = ChatSession::new(&model, &b, None, options).unwrap();
    let first = chat.answer("hello", &mut greedy(), &|| false, &mut |_| Ok(())).unwrap();
    assert_eq!(chat.conversation().len(), 2);
    // The output breaks (a closed pipe) during the second answer.
    let e = chat.answer("the hell", &mut greedy(), &|| false, &mut |_| Err(fusebox::Error::Io("broken pipe".into())));
    assert!(e.unwrap_err().to_string().contains("broken pipe"));
    assert_eq!(chat.conversation().len(), 2, "the failed user message is not kept");
    assert_eq!(chat.cached_tokens(), 0);
    let again = chat.answer("the hell", &mut greedy(), &|| false, &mut |_| Ok(())).unwrap();
    assert_eq!((again.reused, again.restarted), (0, None));
    assert!(again.prompt_tokens > first.prompt_tokens);
    // An interrupted answer stops after one token and stays in the conversation.
    let stopped = chat.answer("hello", &mut greedy(), &|| true, &mut |_| Ok(())).unwrap();
    assert!(stopped.end == TurnEnd::Interrupted || stopped.end == TurnEnd::StopToken, "{stopped:?}");
    assert!(stopped.tokens.len() <= 1);
    assert_eq!(chat.conversation().len(), 6);
    chat.reset();
    assert_eq!((chat.conversation().len(), chat.cached_tokens()), (0, 0));
}

/// The cache dtype chosen at construction (the command line's `--cache-type`, F16 by
/// default) survives every restart of the cache (after `/reset`, or a conversation that no
/// longer extends the cache): a restart once allocated F32 caches, so the same prompt after `/reset` ran on other
/// caches and could answer differently (SmolLM2, 8-bit activations: "How can I help"
/// first, "How can I assist" after `/reset`). On a tiny model: the dtype stays, and
/// the same turn after a reset gives the same tokens as the first.
#[test]
fn a_restarted_cache_keeps_its_dtype_and_the_same_turn_answers_the_same() {
    let path = tiny_model::tiny_gguf(4096);
    let b = CpuBackend::builder().threads(1).build().unwrap();
    let model = open::load(&b, &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let options = ChatOptions { ctx_size: 256, max_tokens: 6, context_shift: false };
    for dtype in [fusebox::DType::F16, fusebox::DType::BF16] {
        let mut chat = ChatSession::with_cache_dtype(&model, &b, None, options, dtype).unwrap();
        let first = chat.answer("hello", &mut greedy(), &|| false, &mut |_| Ok(())).unwrap();
        assert_eq!(chat.cache_dtype(), dtype);
        chat.reset();
        let again = chat.answer("hello", &mut greedy(), &|| false, &mut |_| Ok(())).unwrap();
        assert_eq!(chat.cache_dtype(), dtype, "after /reset");
        assert_eq!((again.reused, again.prompt_tokens), (0, first.prompt_tokens));
        assert_eq!(again.tokens, first.tokens);
    }
}
