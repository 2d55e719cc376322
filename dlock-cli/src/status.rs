//! `dlock status` and `dlock unlock --force`. Neither creates a database file or
//! tables (SQL databases are opened with migrations off, so `status` needs only
//! `SELECT`): on a SQLite file that does not exist, or a database without dlock's
//! tables, nothing is held.

use std::process::ExitCode;

use dlock_api::{ExistingBackend, LockName, LockState};

use crate::exit::{Failure, FREE, SOFTWARE, USAGE};

/// `dlock status NAME [--json]`.
#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// The lock name.
    name: String,
    /// Prints the state as one JSON object: `name`, `held`, `holders` (each with
    /// `owner`, `grant`, `mode`, `token`, `context`, `remaining_lease_ms`,
    /// `remaining_ttl_ms`) and `waiters` (null when the backend cannot tell).
    #[arg(long)]
    json: bool,
}

pub(crate) async fn status(
    backend: &str,
    namespace: &str,
    args: StatusArgs,
) -> Result<ExitCode, Failure> {
    let name = args.name.as_str();
    // A bad name is a usage error even where nothing is stored.
    let full = LockName::with_prefix(namespace, name).map_err(Failure::from)?;
    let state = match dlock_api::open_existing_backend(backend)
        .await
        .map_err(Failure::from)?
    {
        ExistingBackend::NoDatabaseFile(file) => {
            name_check("sqlite", &full)?;
            no_database_note(&file);
            LockState::default()
        }
        ExistingBackend::NoTables => {
            name_check("sql", &full)?;
            no_tables_note(backend);
            LockState::default()
        }
        ExistingBackend::Open(resource) => {
            let manager = crate::manager_on(resource, namespace, None)?;
            let state = manager.inspect(name).await;
            manager.close().await;
            state.map_err(Failure::from)?.unwrap_or_default()
        }
    };
    let held = !state.holders.is_empty();
    if args.json {
        let json = serde_json::json!({
            "name": name,
            "held": held,
            "holders": state.holders,
            "waiters": state.waiters,
        });
        let text = serde_json::to_string(&json)
            .map_err(|e| Failure::new(SOFTWARE, format!("cannot write the state as JSON: {e}")))?;
        println!("{text}");
    } else {
        if !held {
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
    Ok(if held {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(FREE)
    })
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
    let resource = match dlock_api::open_existing_backend(backend)
        .await
        .map_err(Failure::from)?
    {
        ExistingBackend::Open(resource) => resource,
        ExistingBackend::NoDatabaseFile(file) => {
            name_check("sqlite", &full)?;
            no_database_note(&file);
            println!("{name}: removed 0 hold(s)");
            return Ok(ExitCode::SUCCESS);
        }
        ExistingBackend::NoTables => {
            name_check("sql", &full)?;
            no_tables_note(backend);
            println!("{name}: removed 0 hold(s)");
            return Ok(ExitCode::SUCCESS);
        }
        // (`ExistingBackend` may grow.)
        #[allow(unreachable_patterns)]
        _ => {
            return Err(Failure::new(
                SOFTWARE,
                "the backend's store was found in a state this dlock does not know",
            ))
        }
    };
    let admin = resource.admin().ok_or_else(|| {
        Failure::new(
            USAGE,
            format!(
                "the {} backend offers no force-unlock",
                resource.backend_name()
            ),
        )
    })?;
    // The name check an acquire and `status` make.
    resource
        .capabilities()
        .check_name(resource.backend_name(), &full)
        .map_err(Failure::from)?;
    let removed = admin.force_release(&full).await.map_err(Failure::from)?;
    println!("{name}: removed {removed} hold(s)");
    Ok(ExitCode::SUCCESS)
}

/// Where no SQLite file or no dlock tables exist, the name check the SQL backends'
/// acquire would make (a name no acquire could take is not "free"), reported as
/// `backend`'s.
fn name_check(backend: &str, full: &LockName) -> Result<(), Failure> {
    let mut caps = dlock_api::Capabilities::default();
    caps.max_name_len = Some(dlock_api::jdbc::MAX_NAME_LEN);
    caps.check_name(backend, full).map_err(Failure::from)
}

/// Says on stderr that the database has no dlock tables (another table prefix?
/// another database?), so a "free" is not mistaken for one read from them.
fn no_tables_note(backend: &str) {
    eprintln!(
        "dlock: no dlock tables in the database at {}: nothing is held there (none were created; another dlock_table_prefix?)",
        dlock_api::spi::redact_url(backend)
    );
}

/// Says on stderr that the SQLite file was not there (a mistyped path, another
/// working directory), so a "free" is not mistaken for one read from a database.
fn no_database_note(file: &std::path::Path) {
    eprintln!(
        "dlock: no database file at {}: nothing is held there (none was created)",
        file.display()
    );
}
