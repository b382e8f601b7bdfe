//! OpenAI's file objects: what `/v1/files` answers.

use fallow_scheduler::batch::{file_id, FileRecord};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct FileObject {
    pub id: String,
    pub object: &'static str,
    pub bytes: i64,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub filename: String,
    pub purpose: String,
    /// Deprecated by OpenAI but still sent; files are usable once uploaded.
    pub status: &'static str,
    pub status_details: Option<String>,
}

impl From<&FileRecord> for FileObject {
    fn from(file: &FileRecord) -> Self {
        FileObject {
            id: file_id(file.id),
            object: "file",
            bytes: file.bytes,
            created_at: file.created_at.timestamp(),
            expires_at: None,
            filename: file.filename.clone(),
            purpose: file.purpose.clone(),
            status: "processed",
            status_details: None,
        }
    }
}

/// `{"object":"list","data":[…],"first_id","last_id","has_more"}` — OpenAI's cursor page.
#[derive(Debug, Serialize)]
pub struct ListPage<T> {
    pub object: &'static str,
    pub data: Vec<T>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

impl<T> ListPage<T> {
    /// A page from up to `limit + 1` fetched items (the extra one only says `has_more`).
    pub fn new(mut data: Vec<T>, limit: usize, id: impl Fn(&T) -> String) -> Self {
        let has_more = data.len() > limit;
        data.truncate(limit);
        ListPage {
            object: "list",
            first_id: data.first().map(&id),
            last_id: data.last().map(&id),
            data,
            has_more,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct FileDeleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}
