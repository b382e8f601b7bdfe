//! The admin commands' HTTP client and table printer: one call per command, the admin
//! token as a bearer, API errors turned into their message.

use super::admin_cli::AdminClientArgs;
use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::Value;

pub struct AdminClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl AdminClient {
    pub fn new(args: &AdminClientArgs) -> anyhow::Result<AdminClient> {
        Ok(AdminClient {
            http: reqwest::Client::builder().build()?,
            base: format!("{}/admin", args.url.trim_end_matches('/')),
            token: args.token.clone(),
        })
    }

    /// Calls `/admin{path}` and returns its JSON; an error answer becomes its message.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut builder = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            builder = builder.bearer_auth(token);
        }
        if let Some(body) = body {
            builder = builder.json(&body);
        }
        let response = builder
            .send()
            .await
            .with_context(|| format!("reaching the Fallow admin API at {} (--url)", self.base))?;
        let status = response.status();
        let value: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let message = value["error"]["message"]
                .as_str()
                .unwrap_or("no error message");
            bail!("the admin API answered {status}: {message}");
        }
        Ok(value)
    }
}

/// A table column: a header and where its value sits in each row (a JSON pointer).
pub struct Column {
    header: &'static str,
    pointer: &'static str,
    /// A list of `{id: …}` objects shown as their ids.
    ids: bool,
}

impl Column {
    pub const fn new(header: &'static str, pointer: &'static str) -> Column {
        Column {
            header,
            pointer,
            ids: false,
        }
    }
    pub const fn models(header: &'static str, pointer: &'static str) -> Column {
        Column {
            header,
            pointer,
            ids: true,
        }
    }

    fn cell(&self, row: &Value) -> String {
        match row.pointer(self.pointer) {
            None | Some(Value::Null) => "-".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(items)) if self.ids => items
                .iter()
                .filter_map(|m| m["id"].as_str().or(m.as_str()))
                .collect::<Vec<_>>()
                .join(","),
            Some(other) => other.to_string(),
        }
    }
}

/// Rows as an aligned text table with a header line.
pub fn table(columns: &[Column], rows: &[Value]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| columns.iter().map(|c| c.cell(row)).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .chain([c.header.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |values: Vec<&str>| {
        let padded: Vec<String> = values
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(columns.iter().map(|c| c.header).collect());
    for row in &cells {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_table_aligns_its_columns_and_shows_missing_values_as_dashes() {
        let columns = [
            Column::new("ID", "/id"),
            Column::new("STATE", "/state"),
            Column::models("MODELS", "/models"),
        ];
        let rows = [
            json!({"id": "a", "state": "active", "models": [{"id": "m1"}, {"id": "m2"}]}),
            json!({"id": "bbbb", "state": null, "models": []}),
        ];
        assert_eq!(
            table(&columns, &rows),
            "ID    STATE   MODELS\na     active  m1,m2\nbbbb  -\n"
        );
    }
}
