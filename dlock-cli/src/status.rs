//! `dlock status` and `dlock unlock --force`.

use std::process::ExitCode;

use dlock_api::LockName;

use crate::exit::{Failure, USAGE};

pub(crate) async fn status(
    backend: &str,
    namespace: &str,
    name: &str,
) -> Result<ExitCode, Failure> {
    let manager = crate::connect(backend, namespace, None).await?;
    match manager.inspect(name).await.map_err(Failure::from)? {
        None => println!("{name}: free"),
        Some(state) => {
            if state.holders.is_empty() {
                println!("{name}: free");
            }
            for h in &state.holders {
                let lease = h
                    .remaining_lease
                    .map_or_else(|| "session".to_owned(), |d| format!("{}ms", d.as_millis()));
                println!(
                    "{name}: held {} by {} token={} lease_left={lease} context={:?}",
                    h.mode,
                    h.owner,
                    h.token,
                    String::from_utf8_lossy(&h.context)
                );
            }
            if let Some(w) = state.waiters {
                println!("{name}: {w} waiter(s) known to the backend");
            }
        }
    }
    manager.close().await;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn unlock(
    backend: &str,
    namespace: &str,
    name: &str,
    force: bool,
) -> Result<ExitCode, Failure> {
    if !force {
        return Err(Failure::new(
            USAGE,
            format!("refusing to unlock {name:?} without --force: it breaks another process's lock behind its back"),
        ));
    }
    let full = LockName::with_prefix(namespace, name).map_err(Failure::from)?;
    let resource = dlock_api::open_backend(backend)
        .await
        .map_err(Failure::from)?;
    let admin = resource.admin().ok_or_else(|| {
        Failure::new(
            USAGE,
            format!(
                "the {} backend offers no force-unlock",
                resource.backend_name()
            ),
        )
    })?;
    let removed = admin.force_release(&full).await.map_err(Failure::from)?;
    println!("{name}: removed {removed} hold(s)");
    Ok(ExitCode::SUCCESS)
}
