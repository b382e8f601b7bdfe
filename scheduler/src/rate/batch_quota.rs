//! The per-tenant quota of queued batch lines: how many lines of a tenant's unfinished
//! batches may wait at once. A batch still `validating` has not been expanded into jobs yet,
//! so its lines are counted from its input file when it is created (`input_lines`).

use crate::store::ObjectReader;
use crate::SchedulerError;
use sqlx::PgPool;
use tokio::io::AsyncReadExt;
use uuid::Uuid;

/// Lines of `tenant`'s unfinished batches that have not ended yet.
pub async fn queued_lines(pool: &PgPool, tenant: Uuid) -> Result<i64, SchedulerError> {
    Ok(
        sqlx::query_scalar(include_str!("queries/queued_batch_lines.sql"))
            .bind(tenant)
            .fetch_one(pool)
            .await?,
    )
}

/// Records the line count of a new batch's input file.
pub async fn record_input_lines(
    pool: &PgPool,
    batch: Uuid,
    lines: u64,
) -> Result<(), SchedulerError> {
    sqlx::query(include_str!("queries/record_input_lines.sql"))
        .bind(batch)
        .bind(i32::try_from(lines).unwrap_or(i32::MAX))
        .execute(pool)
        .await?;
    Ok(())
}

/// The non-blank lines of a file, read as a stream: what a batch will expand into.
pub async fn count_lines(mut reader: ObjectReader) -> Result<u64, SchedulerError> {
    let mut buf = vec![0u8; 64 << 10];
    let (mut lines, mut blank) = (0u64, true);
    loop {
        let read = reader
            .read(&mut buf)
            .await
            .map_err(|e| SchedulerError::Store(e.into()))?;
        if read == 0 {
            break;
        }
        for &byte in &buf[..read] {
            if byte == b'\n' {
                lines += u64::from(!blank);
                blank = true;
            } else if !byte.is_ascii_whitespace() {
                blank = false;
            }
        }
    }
    Ok(lines + u64::from(!blank))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(bytes: &'static [u8]) -> ObjectReader {
        Box::pin(bytes)
    }

    #[tokio::test]
    async fn blank_lines_do_not_count_and_a_last_line_needs_no_newline() {
        assert_eq!(count_lines(reader(b"")).await.ok(), Some(0));
        assert_eq!(count_lines(reader(b"{}\n{}\n")).await.ok(), Some(2));
        assert_eq!(count_lines(reader(b"{}\n\n  \n{}")).await.ok(), Some(2));
    }
}
