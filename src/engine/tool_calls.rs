//! The grammar of one tool call after the model opened it with `<tool_call>`, in the style its chat
//! template shows calls: a JSON object `{"name": …, "arguments": {…}}` (Hermes, Qwen 2.5 and 3), or
//! Qwen3-Coder's and Qwen3.5's `<function=NAME>` block with a `<parameter=KEY>` block per argument — its
//! value on the lines between, as the template writes it: strings as they are, anything else as JSON.
//! Either way the call names one of the offered tools and, up to its closing `</tool_call>`, only what
//! that tool's parameters allow may come (see `constraint.rs` for when the grammar starts and ends).

use llguidance::api::TopLevelGrammar;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// What opens a tool call (the trigger of the lazy grammar) and what closes it.
pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// A tool the model may call: its name and its parameters' JSON schema.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallableTool {
    pub name: String,
    pub parameters: Value,
}

/// How a model writes a call inside `<tool_call>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStyle {
    /// `{"name": …, "arguments": {…}}`.
    Json,
    /// `<function=NAME>`, `<parameter=KEY>` … `</parameter>` per argument, `</function>`.
    XmlFunctions,
}

/// The JSON object a call of one of `tools` is: its name, and arguments valid for its parameters.
pub fn call_schema(tools: &[CallableTool]) -> Value {
    let call = |t: &CallableTool| {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["name", "arguments"],
            "properties": { "name": { "const": t.name }, "arguments": t.parameters },
        })
    };
    match tools {
        [one] => call(one),
        many => json!({ "anyOf": many.iter().map(call).collect::<Vec<_>>() }),
    }
}

/// The grammar of one call after `<tool_call>`, up to and with `</tool_call>`. `compact` adds the
/// whitespace options JSON is written with (see `OutputFormat::grammar`).
pub fn grammar(tools: &[CallableTool], style: CallStyle, compact: impl Fn(Value) -> Value) -> TopLevelGrammar {
    let close = lark_string(CLOSE);
    let lark = match style {
        CallStyle::Json => {
            format!("start: \"\\n\"? call \"\\n\"? {close}\ncall: %json {}\n", compact(call_schema(tools)))
        }
        CallStyle::XmlFunctions => {
            let mut rules = String::new();
            let calls: Vec<String> =
                tools.iter().enumerate().map(|(i, t)| function_rules(i, t, &compact, &mut rules)).collect();
            format!("start: \"\\n\"? \"<function=\" ({}) \"</function>\\n\" {close}\n{rules}", calls.join(" | "))
        }
    };
    TopLevelGrammar::from_lark(lark)
}

/// Adds to `rules` those of tool `i`'s `<function=…>` block (after `<function=`, up to `</function>`):
/// its name, then each parameter in the schema's order, the required ones always. Returns the rule's name.
fn function_rules(i: usize, tool: &CallableTool, compact: &impl Fn(Value) -> Value, rules: &mut String) -> String {
    let properties = tool.parameters["properties"].as_object().cloned().unwrap_or_default();
    let required: Vec<&str> =
        tool.parameters["required"].as_array().map_or_else(Vec::new, |r| r.iter().filter_map(Value::as_str).collect());
    let mut body = vec![lark_string(&format!("{}>\n", tool.name))];
    for (j, (key, schema)) in properties.iter().enumerate() {
        let value = format!("v_{i}_{j}");
        let opening = lark_string(&format!("<parameter={key}>\n"));
        let optional = if required.contains(&key.as_str()) { "" } else { "?" };
        body.push(format!("({opening} {value}){optional}"));
        rules.push_str(&value_rule(&value, schema, compact));
    }
    let name = format!("call_{i}");
    rules.push_str(&format!("{name}: {}\n", body.join(" ")));
    name
}

/// The rule `name` of a parameter's value and the end of its block: a string as it is (any text that
/// does not end the block), an enumeration one of its strings, anything else JSON valid for `schema`.
fn value_rule(name: &str, schema: &Value, compact: &impl Fn(Value) -> Value) -> String {
    let end = lark_string("\n</parameter>\n");
    if let Some(choices) = schema["enum"].as_array().filter(|c| c.iter().all(Value::is_string)) {
        let choices: Vec<String> = choices.iter().filter_map(Value::as_str).map(lark_string).collect();
        return format!("{name}: ({}) {end}\n", choices.join(" | "));
    }
    if schema["type"] == "string" || schema.get("type").is_none() {
        // The shortest text that ends the block: the value cannot hold its end.
        return format!("{name}[lazy]: /(.|\\n)*\\n<\\/parameter>\\n/\n");
    }
    format!("{name}: {name}_json {end}\n{name}_json: %json {}\n", compact(schema.clone()))
}

/// `text` as a Lark string literal (a JSON string is one).
fn lark_string(text: &str) -> String {
    Value::from(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_schema_names_each_tool_with_its_parameters() {
        let tool = |name: &str| CallableTool { name: name.into(), parameters: json!({ "type": "object" }) };
        let one = call_schema(&[tool("a")]);
        assert_eq!(one["properties"]["name"]["const"], "a");
        let two = call_schema(&[tool("a"), tool("b")]);
        assert_eq!(two["anyOf"][1]["properties"]["name"]["const"], "b");
    }
}
