//! A Responses job's row → its `response` object, whichever api process asks: the settings
//! the request echoes travel with the job (its output format), the text is read by the same
//! [`ResponseBuilder`] as a stream. A stored response whose job has ended is written back to
//! its row once, so it outlives the job's pruning.

use super::builder::ResponseBuilder;
use super::store::{self, StoredResponse};
use crate::error::ApiError;
use crate::follow::aborted;
use crate::openai::responses::{response_id, ResponseObject, ResponseSettings};
use crate::state::AppState;
use fallow_protocol::job::{Completion, OutputFormat};
use fallow_scheduler::queue::{JobRecord, JobState};
use serde_json::Value;
use uuid::Uuid;

/// The echoed settings of a Responses job (`None`: the job is not one).
pub fn settings(format: &OutputFormat) -> Option<ResponseSettings> {
    serde_json::from_value(format.responses.clone()?).ok()
}

/// The builder of a Responses job, as every api process makes it.
pub fn builder(record: &JobRecord, settings: &ResponseSettings) -> ResponseBuilder {
    ResponseBuilder::new(
        record.id,
        record.model.clone(),
        settings,
        &record.request.output,
        settings.background,
    )
}

/// The finished response of a job's `completion`.
pub fn from_completion(
    job: Uuid,
    model: &str,
    format: &OutputFormat,
    completion: &Completion,
) -> Option<ResponseObject> {
    let settings = settings(format)?;
    let builder = ResponseBuilder::new(job, model.to_owned(), &settings, format, false);
    Some(builder.from_completion(completion))
}

/// The response of a job as it stands now.
pub fn from_record(record: &JobRecord) -> Option<ResponseObject> {
    let settings = settings(&record.request.output)?;
    let id = response_id(record.id);
    let model = record.model.clone();
    Some(match record.state {
        JobState::Queued => ResponseObject::new(id, model, &settings, "queued"),
        JobState::Running => ResponseObject::new(id, model, &settings, "in_progress"),
        JobState::Succeeded => {
            let done = record.result.clone().unwrap_or_else(|| aborted(1));
            builder(record, &settings).from_completion(&done)
        }
        JobState::Cancelled => {
            let done = record.result.clone().unwrap_or_else(|| aborted(1));
            let mut response = builder(record, &settings).from_completion(&done);
            response.status = "cancelled";
            response.incomplete_details = None;
            response
        }
        JobState::Failed => builder(record, &settings).failed(
            "server_error",
            record.error.as_deref().unwrap_or("The job failed."),
        ),
    })
}

/// A stored response as it stands now; a finished one is written back to its row.
pub async fn current(state: &AppState, stored: &StoredResponse) -> Result<Value, ApiError> {
    if let Some(response) = &stored.response {
        return Ok(response.clone());
    }
    let Some(record) = state.queue().get(stored.id).await? else {
        return Err(ApiError::NotFound(format!(
            "The response `{}` is no longer available.",
            response_id(stored.id)
        )));
    };
    let response = from_record(&record)
        .ok_or_else(|| ApiError::Internal("a stored response's job is not a response".into()))?;
    let value = serde_json::to_value(&response).map_err(|e| ApiError::Internal(e.to_string()))?;
    if record.state.is_finished() {
        store::finish(state.queue().pool(), stored.id, &value).await?;
    }
    Ok(value)
}
