//! Anthropic's and Ollama's APIs through their official Python clients (`anthropic`, `ollama`), against
//! one real node serving SmolLM2: every greedy answer equals the OpenAI API's for the same request (same
//! messages, temperature 0, same token limit), with the same stop reason and token counts; streams give
//! what whole answers give; Anthropic's stream sends Anthropic's exact event sequence; errors come in
//! each API's shape; Ollama's listing routes name the model the cluster serves. The tool paths (tools
//! offered, a call and its result sent back) of the three APIs answer alike too, and a reply that is a
//! call (the model constrained to write one) reaches OpenAI's and Ollama's clients as their tool calls.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

fn serve_model() -> TestCluster {
    let mut c = TestCluster::with_network(1, Network::Loopback);
    c.form(&[]); // waits for the node's telemetry, which placement needs
    let model = common::model_path();
    let args = ["run", model.to_str().unwrap(), "--context", "512", "--sequences", "2", "--threads", "1"];
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    c
}

/// Runs tests/fixtures/api_clients.py against node 0 and parses what it printed.
fn run_clients(c: &TestCluster) -> Value {
    c.python_clients(0, "api_clients.py", MODEL)
}

/// POSTs `body` to `path` and returns the status, the content type and the body's lines.
fn post_lines(c: &TestCluster, path: &str, body: Value) -> (u16, String, Vec<String>) {
    let url = format!("http://127.0.0.1:{}{path}", c.nodes[0].api_port);
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let response = agent.post(&url).send_json(body).expect("the API answers");
    let status = response.status().as_u16();
    let kind = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let lines = BufReader::new(response.into_body().into_reader()).lines().map(Result::unwrap).collect();
    (status, kind, lines)
}

#[test]
fn anthropic_and_ollama_clients_get_what_the_openai_api_gives() {
    let _one_at_a_time = common::cluster::exclusive();
    let c = serve_model();
    let r = run_clients(&c);
    let (openai, single) = (&r["openai"], &r["openai_single"]);
    let text = openai["text"].as_str().unwrap();
    assert!(!text.is_empty(), "{r:#}");
    // The two conversations end differently: one by itself, one at the token limit.
    assert_eq!(openai["finish"], "stop", "{r:#}");
    assert_eq!(single["finish"], "length", "{r:#}");

    // OpenAI with tools: the tool path renders what the plain path renders when the template ignores
    // tools, holds no text back, and takes a call and its result.
    assert_eq!(r["openai_tools"], json!({ "text": single["text"], "finish": "length", "calls": 0 }), "{r:#}");
    assert_eq!(r["openai_tools_stream"], json!({ "text": single["text"], "finish": ["length"] }), "{r:#}");
    assert!(r["openai_tool_result"]["text"].as_str().is_some_and(|t| !t.is_empty()), "{r:#}");
    // A reply that is a call (the model constrained to write one): OpenAI's `tool_calls` with the
    // arguments as a JSON string and finish reason `tool_calls`, whole and as stream deltas; Ollama's
    // `message.tool_calls` with the arguments as an object.
    let call = json!({ "type": "function", "name": "get_weather", "arguments": { "city": "Paris" }, "id": true });
    assert_eq!(r["openai_tool_call"], json!({ "finish": "tool_calls", "content": "", "calls": [call] }), "{r:#}");
    let streamed =
        json!({ "finish": ["tool_calls"], "names": ["get_weather"], "arguments": { "city": "Paris" }, "content": "" });
    assert_eq!(r["openai_tool_call_stream"], streamed, "{r:#}");
    let ollama_call = json!([{ "name": "get_weather", "arguments": { "city": "Paris" } }]);
    assert_eq!(r["ollama_tool_call"], json!({ "content": "", "calls": ollama_call }), "{r:#}");
    // tool_choice "required", a named function and Anthropic's "any": a call of the tool with the
    // arguments its parameters require (a string `city`), whatever the model would have said.
    let required = json!({ "finish": "tool_calls", "calls": [{ "name": "get_weather", "city": true }] });
    assert_eq!(r["openai_required"], required, "{r:#}");
    assert_eq!(r["openai_named"], required, "{r:#}");
    let any = json!({ "stop_reason": "tool_use", "uses": [{ "name": "get_weather", "city": true }] });
    assert_eq!(r["anthropic_any"], any, "{r:#}");
    assert_eq!(r["openai_tool_choice"]["status"], 400, "{r:#}");
    assert!(r["openai_tool_choice"]["message"].as_str().unwrap().contains("not among the tools"), "{r:#}");
    assert!(r["openai_tool_choice"]["message"].as_str().unwrap().contains("tool_choice"), "{r:#}");

    // Anthropic: system as a string or as blocks, multi-turn, whole and streamed.
    let anthropic = &r["anthropic"];
    assert_eq!(anthropic["text"], text);
    assert_eq!((&anthropic["type"], &anthropic["role"]), (&json!("message"), &json!("assistant")));
    assert_eq!(anthropic["stop_reason"], "end_turn");
    // The prompt cache may have given back part of the conversation: Anthropic counts those tokens
    // apart (`cache_read_input_tokens`), Ollama counts only the tokens evaluated.
    let read = anthropic["cache_read"].as_u64().unwrap();
    assert_eq!(anthropic["input"].as_u64().unwrap() + read, openai["prompt"].as_u64().unwrap(), "{r:#}");
    assert_eq!(anthropic["output"], openai["completion"]);
    assert_eq!(r["anthropic_single"]["text"], single["text"]);
    assert_eq!(r["anthropic_single"]["stop_reason"], "max_tokens");
    assert_eq!(r["anthropic_single"]["output"], single["completion"]);
    assert_eq!(r["anthropic_blocks"], text);
    assert_eq!(r["anthropic_stream"], text);
    assert_eq!(r["anthropic_stream_stop"], "end_turn");
    assert_eq!(r["anthropic_stream_input"], openai["prompt"]);
    assert_eq!(r["anthropic_stream_output"], openai["completion"]);
    assert_eq!(r["anthropic_helper"], text);
    assert_eq!(r["anthropic_helper_final"], text);
    let deltas = r["anthropic_events"].as_array().unwrap().iter().filter(|e| *e == "content_block_delta").count();
    assert!(deltas > 1, "streamed in more than one piece: {r:#}");
    // A stop sequence from the middle of the answer ends it there and is named.
    let stop = &r["stop"];
    let word = stop["word"].as_str().unwrap();
    assert_eq!(stop["text"], &text[..text.find(word).unwrap()], "{stop}");
    assert_eq!((&stop["reason"], &stop["sequence"]), (&json!("stop_sequence"), &json!(word)));
    // Errors in Anthropic's shape, through the SDK's exception classes.
    assert_eq!(r["anthropic_error"]["status"], 404, "{r:#}");
    assert_eq!(r["anthropic_error"]["body"]["type"], "error");
    assert_eq!(r["anthropic_error"]["body"]["error"]["type"], "not_found_error");
    assert_eq!(r["anthropic_bad"]["status"], 400, "{r:#}");
    assert_eq!(r["anthropic_bad"]["body"]["error"]["type"], "invalid_request_error");
    assert!(r["anthropic_bad"]["body"]["error"]["message"].as_str().unwrap().contains("max_tokens"));
    assert_eq!(r["anthropic_models"], json!([MODEL]));
    // Anthropic's tools, tool_use and tool_result take the same path as OpenAI's tools, calls and results.
    let offered = json!({ "text": single["text"], "stop_reason": "max_tokens", "blocks": ["text"] });
    assert_eq!(r["anthropic_tools"], offered, "{r:#}");
    assert_eq!(r["anthropic_tool_result"], r["openai_tool_result"]["text"], "{r:#}");
    assert_eq!(r["anthropic_tool_result_stream"], r["openai_tool_result"]["text"], "{r:#}");

    // Ollama: chat whole and streamed, generate through the template and raw, at /api and /ollama/api.
    let chat = &r["ollama_chat"];
    assert_eq!(chat["text"], text);
    assert_eq!((&chat["done"], &chat["reason"]), (&json!(true), &json!("stop")));
    let evaluated = chat["prompt"].as_u64().unwrap();
    assert!(evaluated >= 1 && evaluated <= openai["prompt"].as_u64().unwrap(), "{r:#}");
    assert_eq!(chat["eval"], openai["completion"]);
    assert!(chat["total"].as_u64().unwrap() > 0 && chat["eval_ns"].as_u64() <= chat["total"].as_u64(), "{chat}");
    assert_eq!(r["ollama_chat_stream"], text);
    assert!(r["ollama_chat_stream_chunks"].as_u64().unwrap() > 1, "{r:#}");
    let last = &r["ollama_chat_stream_last"];
    assert_eq!(*last, json!({ "done": true, "reason": "stop", "eval": openai["completion"], "earlier_done": false }));
    assert_eq!(r["ollama_generate"], single["text"]);
    assert_eq!(r["ollama_generate_stream"], single["text"]);
    assert_eq!(r["ollama_generate_raw"], r["openai_raw"]);
    assert_eq!(r["ollama_prefixed"], single["text"], "MODEL:latest under /ollama");
    assert_eq!(r["ollama_error"]["status"], 404, "{r:#}");
    // Ollama's tools and tool messages take the OpenAI route's tool path too.
    assert_eq!(r["ollama_tools"], json!({ "text": single["text"], "calls": 0 }), "{r:#}");
    assert_eq!(r["ollama_tool_result"], r["openai_tool_result"]["text"], "{r:#}");
    assert_eq!(r["ollama_tool_result_stream"], r["openai_tool_result"]["text"], "{r:#}");
    // What it serves, by the name the cluster serves it under.
    let listed = &r["ollama_list"][0];
    assert_eq!((&listed["model"], &listed["family"]), (&json!(MODEL), &json!("llama")), "{r:#}");
    assert!(listed["size"].as_u64().unwrap() > 1_000_000, "{listed}");
    let show = &r["ollama_show"];
    assert_eq!((&show["family"], &show["quant"]), (&json!("llama"), &json!("Q4_1")), "{show}");
    assert_eq!(show["info"]["general.architecture"], "llama");
    assert_eq!(show["caps"], json!(["completion"]));
    assert_eq!(r["ollama_ps"], json!([{ "model": MODEL, "context": 512 }]));
    assert!(c.get_json(0, "/api/version")["version"].as_str().is_some_and(|v| !v.is_empty()));
}

#[test]
fn anthropic_streams_its_exact_event_sequence_and_ollama_streams_ndjson_by_default() {
    let _one_at_a_time = common::cluster::exclusive();
    let c = serve_model();
    let messages = json!([{ "role": "user", "content": "Name a colour." }]);
    let body = json!({ "model": MODEL, "max_tokens": 8, "temperature": 0, "messages": messages, "stream": true });
    let (status, kind, lines) = post_lines(&c, "/v1/messages", body);
    assert_eq!(status, 200, "{lines:?}");
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    let events: Vec<&str> = lines.iter().filter_map(|l| l.strip_prefix("event: ")).collect();
    let data: Vec<Value> =
        lines.iter().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    let deltas = events.iter().filter(|e| **e == "content_block_delta").count();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert!(deltas > 1, "{lines:?}");
    assert_eq!(events, expected);
    // Each event's data names its type; the usage arrives at the start (input) and the end (output).
    for (event, data) in events.iter().zip(&data) {
        assert_eq!(data["type"], *event, "{data}");
    }
    assert!(data[0]["message"]["usage"]["input_tokens"].as_u64().unwrap() > 0, "{}", data[0]);
    let end = &data[data.len() - 2];
    assert_eq!(end["delta"]["stop_reason"], "max_tokens", "{end}");
    assert_eq!(end["usage"]["output_tokens"], 8, "{end}");

    // Errors on /v1/messages are Anthropic's: no max_tokens, a broken body, an unsupported role, system
    // messages alone (among others they join the system prompt).
    for (body, needle) in [
        (json!({ "model": MODEL, "messages": messages }).to_string(), "max_tokens"),
        ("{not json".to_string(), "not valid JSON"),
        (
            json!({ "model": MODEL, "max_tokens": 4, "messages": [{ "role": "robot", "content": "x" }] }).to_string(),
            "role",
        ),
        (
            json!({ "model": MODEL, "max_tokens": 4, "messages": [{ "role": "system", "content": "x" }] }).to_string(),
            "user message",
        ),
    ] {
        let url = format!("http://127.0.0.1:{}/v1/messages", c.nodes[0].api_port);
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut response = agent.post(&url).header("Content-Type", "application/json").send(body.clone()).unwrap();
        let answer: Value = response.body_mut().read_json().unwrap();
        assert_eq!(response.status().as_u16(), 400, "{body}: {answer}");
        assert_eq!(answer["type"], "error", "{answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(needle), "{body}: {answer}");
    }

    // Ollama streams unless told not to: one JSON object per line, the last one done with the counts.
    let body = json!({ "model": MODEL, "prompt": "Name a colour.", "options": { "temperature": 0, "num_predict": 6 } });
    let (status, kind, lines) = post_lines(&c, "/api/generate", body);
    assert_eq!(status, 200, "{lines:?}");
    assert_eq!(kind, "application/x-ndjson");
    let objects: Vec<Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(objects.len() > 2, "{lines:?}");
    assert!(objects[..objects.len() - 1].iter().all(|o| o["done"] == false && o["response"].is_string()));
    let last = objects.last().unwrap();
    assert_eq!((&last["done"], &last["done_reason"], &last["eval_count"]), (&json!(true), &json!("length"), &json!(6)));
    let (status, answer) = c.post_json(0, "/api/chat", json!({ "model": MODEL, "messages": [], "stream": false }));
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("messages"), "Ollama's shape: {answer}");
}
