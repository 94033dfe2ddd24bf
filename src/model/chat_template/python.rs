//! What chat templates expect of Python's Jinja as Hugging Face renders them, and minijinja does
//! otherwise: `tojson` as `json.dumps(x, ensure_ascii=False, indent=…, separators=…, sort_keys=…)` (`", "`
//! and `": "` between items, no HTML escaping: minijinja's own is compact and escapes `<>&'`), and the
//! global `strftime_now(format)` for the date in system prompts (Llama 3, gpt-oss).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use std::fmt::Write;

/// `value | tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)`.
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(invalid("tojson's separators must be two strings")),
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let style = Style { indent, item, key, sort_keys, ensure_ascii };
    let mut out = String::new();
    style.write(&mut out, value, 0)?;
    Ok(Value::from_safe_string(out))
}

fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_string())
}

struct Style {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl Style {
    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(out, value)?,
            ValueKind::String | ValueKind::Bytes => self.string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(out, '[', ']', depth, items.len(), |out, i| self.write(out, &items[i], depth + 1))?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.container(out, '{', '}', depth, keys.len(), |out, i| {
                    let key = &keys[i];
                    match key.as_str() {
                        Some(s) => self.string(out, s),
                        None => self.string(out, &key.to_string()),
                    }
                    out.push_str(&self.key);
                    self.write(out, &value.get_item(key)?, depth + 1)
                })?;
            }
            _ => return Err(invalid(&format!("tojson cannot write a {} value", value.kind()))),
        }
        Ok(())
    }

    /// A list or object of `len` items, each written by `item`, laid out as Python's `json.dumps` does.
    fn container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        depth: usize,
        len: usize,
        mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, level: usize| {
            if let Some(indent) = &self.indent {
                out.push('\n');
                (0..level).for_each(|_| out.push_str(indent));
            }
        };
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item);
            }
            newline(out, depth + 1);
            item(out, i)?;
        }
        newline(out, depth);
        out.push(close);
        Ok(())
    }

    fn number(&self, out: &mut String, value: &Value) -> Result<(), Error> {
        if value.is_integer() {
            write!(out, "{value}").expect("writing to a string");
            return Ok(());
        }
        let f = f64::try_from(value.clone())?;
        match f {
            f if f.is_nan() => out.push_str("NaN"),
            f if f.is_infinite() => out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" }),
            // Python's repr: the shortest digits that read back, always with a point or an exponent.
            f if f.fract() == 0.0 && f.abs() < 1e16 => write!(out, "{f:.1}").expect("writing to a string"),
            f if f.abs() >= 1e16 || f.abs() < 1e-4 => {
                let text = format!("{f:e}");
                let (mantissa, exponent) = text.split_once('e').expect("{:e} has an exponent");
                let exponent: i32 = exponent.parse().expect("{:e} writes an integer exponent");
                write!(out, "{mantissa}e{}{:02}", if exponent < 0 { '-' } else { '+' }, exponent.abs())
                    .expect("writing to a string");
            }
            f => write!(out, "{f}").expect("writing to a string"),
        }
        Ok(())
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32).expect("writing to a string"),
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        write!(out, "\\u{unit:04x}").expect("writing to a string");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// `strftime_now(format)` at `now_ms` (UTC): the C library's directives templates use (`%Y %m %d %e %B
/// %b %A %a %H %M %S %j %y %p %I %%`); any other is kept as written.
pub fn strftime(format: &str, now_ms: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let t = crate::util::CivilTime::at(now_ms);
    let month = MONTHS[t.month as usize - 1];
    let day = DAYS[t.weekday as usize];
    let hour12 = if t.hour.is_multiple_of(12) { 12 } else { t.hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{}", t.year),
            Some('y') => write!(out, "{:02}", t.year.rem_euclid(100)),
            Some('m') => write!(out, "{:02}", t.month),
            Some('d') => write!(out, "{:02}", t.day),
            Some('e') => write!(out, "{:2}", t.day),
            Some('B') => write!(out, "{month}"),
            Some('b') | Some('h') => write!(out, "{}", &month[..3]),
            Some('A') => write!(out, "{day}"),
            Some('a') => write!(out, "{}", &day[..3]),
            Some('H') => write!(out, "{:02}", t.hour),
            Some('I') => write!(out, "{hour12:02}"),
            Some('p') => write!(out, "{}", if t.hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{:02}", t.minute),
            Some('S') => write!(out, "{:02}", t.second),
            Some('j') => write!(out, "{:03}", t.day_of_year),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::Environment;

    fn render(source: &str, value: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(source, minijinja::context! { x => value }).unwrap()
    }

    #[test]
    fn tojson_writes_what_pythons_json_dumps_writes() {
        // Expected texts as Python 3's json.dumps writes them (ensure_ascii=False).
        let x = serde_json::json!({ "b": [1, 2.5, true, null], "a": "<é\n\"\u{1}>", "c": {}, "d": [] });
        assert_eq!(
            render("{{ x | tojson }}", x.clone()),
            r#"{"b": [1, 2.5, true, null], "a": "<é\n\"\u0001>", "c": {}, "d": []}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", serde_json::json!({ "k": [1, { "z": 0 }] })),
            "{\n  \"k\": [\n    1,\n    {\n      \"z\": 0\n    }\n  ]\n}"
        );
        assert_eq!(
            render("{{ x | tojson(sort_keys=true) }}", x.clone()),
            r#"{"a": "<é\n\"\u0001>", "b": [1, 2.5, true, null], "c": {}, "d": []}"#
        );
        assert_eq!(
            render("{{ x | tojson(separators=(',', ':')) }}", serde_json::json!([1, { "a": 2 }])),
            r#"[1,{"a":2}]"#
        );
        assert_eq!(render("{{ x | tojson(ensure_ascii=true) }}", serde_json::json!("é😀")), r#""\u00e9\ud83d\ude00""#);
        assert_eq!(
            render("{{ x | tojson }}", serde_json::json!([1e20, 0.00001, 3.0, -0.5])),
            "[1e+20, 1e-05, 3.0, -0.5]"
        );
    }

    #[test]
    fn strftime_spells_dates_as_the_c_library_does() {
        // 2026-12-01T04:30:45Z was a Tuesday, the 335th day of the year.
        let at = 1_796_099_445_123;
        assert_eq!(strftime("%Y-%m-%d", at), "2026-12-01");
        assert_eq!(strftime("%d %b %Y", at), "01 Dec 2026");
        assert_eq!(
            strftime("%A, %B %e %H:%M:%S %p %I %j %y %% %Q", at),
            "Tuesday, December  1 04:30:45 AM 04 335 26 % %Q"
        );
    }
}
