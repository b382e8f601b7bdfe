//! `fallow generate` and `fallow chat`: the engine alone, no services, streaming to stdout.

use crate::cli::{ChatArgs, CudaArgs, GenerateArgs, SamplingArgs};
use crate::config::CudaFile;
use anyhow::Context;
use fallow_engine::llm::{EngineRequest, LlmEngine};
use fallow_engine::prompt::encode_chat;
use fallow_engine::runtime::{self, Device, LoadOptions, LoadedModel};
use fallow_protocol::job::{ChatMessage, GenerateRequest, Role, Sampling};
use std::io::{BufRead, Write};
use std::path::Path;

fn load(
    model: &Path,
    chat_template: Option<&Path>,
    device: Device,
    cuda: &CudaArgs,
) -> anyhow::Result<LoadedModel> {
    let options = LoadOptions {
        chat_template_file: chat_template.map(Path::to_path_buf),
        device,
        cuda: cuda.options(CudaFile::default())?,
        max_num_seqs: 4,
        ..LoadOptions::default()
    };
    runtime::load(model, &options).with_context(|| format!("loading {}", model.display()))
}

fn sampling(args: &SamplingArgs) -> Sampling {
    Sampling {
        max_tokens: Some(args.max_tokens),
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        ..Sampling::default()
    }
}

/// Runs one request to the end, printing text as it is generated; returns the whole text.
fn stream_to_stdout(
    engine: &mut LlmEngine,
    prompt: Vec<u32>,
    sampling: Sampling,
) -> anyhow::Result<String> {
    engine
        .add_request(EngineRequest {
            adapter: None,
            id: 1,
            prompt,
            sampling,
            n: 1,
            priority: 0,
            resume: None,
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut text = String::new();
    let mut stdout = std::io::stdout();
    while engine.has_work() {
        for out in engine.step().map_err(|e| anyhow::anyhow!("{e}"))? {
            print!("{}", out.text);
            text.push_str(&out.text);
        }
        stdout.flush()?;
    }
    Ok(text)
}

pub fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    let mut model = load(
        &args.model,
        args.chat_template.as_deref(),
        args.device,
        &args.cuda,
    )?;
    let sampling = sampling(&args.sampling);
    let prompt = if args.chat {
        let message = ChatMessage::text(Role::User, args.prompt.clone());
        encode_chat(
            &model.frontend,
            &GenerateRequest::chat("", vec![message], sampling.clone()),
        )
        .map_err(|(_, message)| anyhow::anyhow!(message))?
    } else {
        let tok = &model.frontend.tokenizer;
        tok.encode(&args.prompt, tok.add_bos_by_default())
            .map_err(|e| anyhow::anyhow!("{e}"))?
    };
    stream_to_stdout(&mut model.engine, prompt, sampling)?;
    println!();
    Ok(())
}

pub fn chat(args: ChatArgs) -> anyhow::Result<()> {
    let mut model = load(
        &args.model,
        args.chat_template.as_deref(),
        args.device,
        &args.cuda,
    )?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::text(Role::System, system));
    }
    eprintln!(
        "Chatting with {} — an empty line or Ctrl-D ends.",
        args.model.display()
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        messages.push(ChatMessage::text(Role::User, line.trim_end()));
        let request = GenerateRequest::chat("", messages.clone(), sampling(&args.sampling));
        let prompt = match encode_chat(&model.frontend, &request) {
            Ok(p) => p,
            Err((_, m)) => {
                eprintln!("error: {m}");
                messages.pop();
                continue;
            }
        };
        let reply = stream_to_stdout(&mut model.engine, prompt, request.sampling)?;
        println!();
        messages.push(ChatMessage::text(Role::Assistant, reply.as_str()));
    }
}
