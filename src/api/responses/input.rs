//! A Responses request's input as a conversation: its items (messages, the function calls an earlier
//! reply made, their outputs, earlier reasoning) turned into the turns a chat template takes, its
//! function tools into the chat form the rest of the API uses, and `tool_choice` and `text.format`
//! into theirs.

use crate::api::tools::Turn;
use crate::api::ApiError;
use crate::model::ChatMessage;
use serde_json::{json, Value};

/// The turns of a conversation given as Responses input items. Consecutive function calls (and the
/// message before them) are one assistant turn, as chat templates take parallel calls; a reasoning item
/// goes with the assistant turn after it.
pub fn turns(items: &[Value]) -> Result<Vec<Turn>, ApiError> {
    let mut turns: Vec<Turn> = Vec::new();
    let mut reasoning: Option<String> = None;
    for item in items {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item["role"].as_str().ok_or_else(|| bad("a message item needs a `role`"))?;
                let role = match role {
                    "user" | "system" | "assistant" => role,
                    "developer" => "system",
                    other => return Err(bad(format!("unknown role {other:?}"))),
                };
                let content = text_of(&item["content"])?;
                let mut turn = Turn::plain(ChatMessage { role: role.to_string(), content });
                if role == "assistant" {
                    turn.reasoning = reasoning.take();
                }
                turns.push(turn);
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (item["call_id"].as_str(), item["name"].as_str()) else {
                    return Err(bad("a function_call item needs `call_id` and `name`"));
                };
                let arguments = match &item["arguments"] {
                    Value::String(s) => s.clone(),
                    Value::Null => "{}".to_string(),
                    other => other.to_string(),
                };
                let call =
                    json!({ "id": call_id, "type": "function", "function": { "name": name, "arguments": arguments } });
                match turns.last_mut() {
                    // Calls after an assistant's message, or after other calls, are that turn's.
                    Some(last) if last.message.role == "assistant" => last.calls.push(call),
                    _ => {
                        let mut turn = Turn::plain(ChatMessage { role: "assistant".into(), content: String::new() });
                        turn.reasoning = reasoning.take();
                        turn.calls.push(call);
                        turns.push(turn);
                    }
                }
            }
            "function_call_output" => {
                let call_id = item["call_id"].as_str().ok_or_else(|| bad("a function_call_output needs `call_id`"))?;
                let output = match &item["output"] {
                    Value::String(s) => s.clone(),
                    parts @ Value::Array(_) => text_of(parts)?,
                    other => other.to_string(),
                };
                let mut turn = Turn::plain(ChatMessage { role: "tool".into(), content: output });
                turn.answers = Some(call_id.to_string());
                turns.push(turn);
            }
            "reasoning" => {
                // What an earlier reply reasoned: its text, or its summary's.
                let parts = [&item["content"], &item["summary"]];
                let text: String = parts
                    .iter()
                    .filter_map(|p| p.as_array())
                    .flatten()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                reasoning = Some(text);
            }
            other => {
                return Err(bad(format!(
                    "input items of type {other:?} are not supported (message, function_call, function_call_output \
                     and reasoning are)"
                )))
            }
        }
    }
    Ok(turns)
}

/// The text of a message's content: a string, or parts of text (`input_text`, `output_text`, `text`).
fn text_of(content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p["type"].as_str() {
                Some("input_text" | "output_text" | "text" | "summary_text") => {
                    Ok(p["text"].as_str().unwrap_or_default().to_string())
                }
                Some("refusal") => Ok(p["refusal"].as_str().unwrap_or_default().to_string()),
                other => Err(bad(format!("content of type {other:?} is not supported (text only)"))),
            })
            .collect(),
        Value::Null => Ok(String::new()),
        other => Err(bad(format!("a message's content must be a string or a list of parts, not {other}"))),
    }
}

/// The request's function tools in the chat form (`{"type": "function", "function": {…}}`). Tools of
/// other types (OpenAI's hosted ones: web search, file search, a computer) cannot run here: they are
/// left out, and the model is not told of them.
pub fn tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut chat = Vec::new();
    for tool in tools {
        if tool["type"] != "function" {
            tracing::debug!("a Responses request offers a {} tool, which this node cannot run", tool["type"]);
            continue;
        }
        let name =
            tool["name"].as_str().ok_or_else(|| ApiError::bad_param("tools", "a function tool needs a `name`"))?;
        let mut function = json!({ "name": name });
        for field in ["description", "parameters", "strict"] {
            if let Some(v) = tool.get(field).filter(|v| !v.is_null()) {
                function[field] = v.clone();
            }
        }
        chat.push(json!({ "type": "function", "function": function }));
    }
    Ok(chat)
}

/// `tool_choice` in the chat form: `auto`, `none`, `required`, or `{"type": "function", "name": …}`
/// (the chat form nests the name under `function`).
pub fn tool_choice(choice: Option<&Value>) -> Option<Value> {
    match choice? {
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") && o.contains_key("name") => {
            Some(json!({ "type": "function", "function": { "name": o["name"] } }))
        }
        other => Some(other.clone()),
    }
}

/// `text.format` as chat's `response_format`: `text`, `json_object`, or `json_schema` with the schema
/// beside the name (chat nests it under `json_schema`).
pub fn response_format(text: Option<&Value>) -> Option<Value> {
    let format = text?.get("format")?;
    match format["type"].as_str() {
        Some("json_schema") => Some(json!({ "type": "json_schema", "json_schema": { "schema": format["schema"] } })),
        _ => Some(format.clone()),
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_param("input", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_the_turns_a_template_takes() {
        let items = json!([
            { "role": "developer", "content": "Be brief." },
            { "type": "message", "role": "user", "content": [{ "type": "input_text", "text": "Weather in " }, { "type": "input_text", "text": "Paris?" }] },
            { "type": "reasoning", "summary": [{ "type": "summary_text", "text": "Use the tool." }] },
            { "type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" },
            { "type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}" },
            { "type": "function_call_output", "call_id": "c1", "output": "sunny" },
            { "type": "function_call_output", "call_id": "c2", "output": "noon" },
            { "role": "assistant", "content": [{ "type": "output_text", "text": "Sunny at noon." }] },
        ]);
        let turns = turns(items.as_array().unwrap()).unwrap();
        let roles: Vec<&str> = turns.iter().map(|t| t.message.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "tool", "assistant"]);
        assert_eq!(turns[1].message.content, "Weather in Paris?");
        assert_eq!(turns[2].calls.len(), 2, "parallel calls are one assistant turn");
        assert_eq!(turns[2].calls[0]["function"]["name"], "get_weather");
        assert_eq!(turns[2].reasoning.as_deref(), Some("Use the tool."));
        assert_eq!((turns[3].answers.as_deref(), turns[3].message.content.as_str()), (Some("c1"), "sunny"));
        assert_eq!(turns[5].message.content, "Sunny at noon.");
    }

    #[test]
    fn what_cannot_be_read_is_refused_naming_it() {
        for (items, says) in [
            (json!([{ "type": "item_reference", "id": "x" }]), "item_reference"),
            (json!([{ "role": "user", "content": [{ "type": "input_image", "image_url": "x" }] }]), "input_image"),
            (json!([{ "role": "robot", "content": "hi" }]), "robot"),
            (json!([{ "type": "function_call", "name": "f" }]), "call_id"),
        ] {
            let error = turns(items.as_array().unwrap()).err().unwrap();
            assert!(error.body().to_string().contains(says), "{}", error.body());
        }
    }

    #[test]
    fn tools_choice_and_format_take_the_chat_form() {
        let given = json!([
            { "type": "function", "name": "get_weather", "description": "d", "parameters": { "type": "object" } },
            { "type": "web_search" },
        ]);
        let chat = tools(given.as_array().unwrap()).unwrap();
        assert_eq!(
            chat,
            vec![
                json!({ "type": "function", "function": { "name": "get_weather", "description": "d", "parameters": { "type": "object" } } })
            ]
        );
        assert!(tools(&[json!({ "type": "function" })]).is_err());
        let named = tool_choice(Some(&json!({ "type": "function", "name": "get_weather" }))).unwrap();
        assert_eq!(named, json!({ "type": "function", "function": { "name": "get_weather" } }));
        assert_eq!(tool_choice(Some(&json!("required"))), Some(json!("required")));
        let schema = json!({ "format": { "type": "json_schema", "name": "x", "schema": { "type": "object" } } });
        assert_eq!(
            response_format(Some(&schema)),
            Some(json!({ "type": "json_schema", "json_schema": { "schema": { "type": "object" } } }))
        );
        assert_eq!(response_format(Some(&json!({ "format": { "type": "text" } }))), Some(json!({ "type": "text" })));
    }
}
