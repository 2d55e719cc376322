//! Answering a renewal batch in two parts ([`crate::BatchRenew`]): the requests a
//! backend folds into calls of its own, and the rest, each renewed on its own — at
//! the same time, the answers back in the requests' order. Every backend that
//! batches splits its batches so; only what it folds, and how, is its own.

use std::future::Future;

use futures_util::future::join_all;

use crate::{Error, RenewRequest, RenewResult, Result};

/// Answers `reqs` as one batch: the requests `batchable` picks go to `together`
/// (their indexes into `reqs`, in order; it answers one result per index, in that
/// order), the others to `alone`, one call each, all at once. The answers come back
/// in `reqs`' order; a part that answers too few results answers the rest with an
/// error (a bug in the backend).
///
/// ```
/// # tokio_test_block_on(async {
/// use dlock_spi::{GrantId, LockMode, LockName, OwnerId, RenewRequest, RenewResult, FencingToken};
/// use std::time::Duration;
/// let req = |mode| RenewRequest::new(
///     LockName::new("a").unwrap(), OwnerId::new("o"), GrantId::new(1), mode,
///     Duration::from_secs(5), FencingToken::new(1));
/// let reqs = [req(LockMode::Exclusive), req(LockMode::Shared), req(LockMode::Exclusive)];
/// let answers = dlock_spi::split_batch(
///     &reqs,
///     |r| r.mode == LockMode::Exclusive,
///     |batched| async move {
///         assert_eq!(batched, [0, 2]); // one call of the store's for both
///         batched.iter().map(|_| Ok(RenewResult::renewed(None))).collect()
///     },
///     |_| async { Ok(RenewResult::NotOwner) }, // the shared hold, on its own
/// )
/// .await;
/// let renewed: Vec<bool> = answers.iter().map(|a| matches!(a, Ok(RenewResult::Renewed { .. }))).collect();
/// assert_eq!(renewed, [true, false, true]);
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
///
/// # Cancel safety
///
/// As the parts' own calls: dropped, each renewal may or may not have been applied.
pub async fn split_batch<'r, T, TF, A, AF>(
    reqs: &'r [RenewRequest],
    batchable: impl Fn(&RenewRequest) -> bool,
    together: T,
    alone: A,
) -> Vec<Result<RenewResult>>
where
    T: FnOnce(Vec<usize>) -> TF,
    TF: Future<Output = Vec<Result<RenewResult>>>,
    A: Fn(&'r RenewRequest) -> AF,
    AF: Future<Output = Result<RenewResult>>,
{
    let (batched, singly): (Vec<usize>, Vec<usize>) =
        (0..reqs.len()).partition(|&i| batchable(&reqs[i]));
    let folded = together(batched.clone());
    let each = join_all(singly.iter().map(|&i| alone(&reqs[i])));
    let (folded, each) = tokio::join!(folded, each);
    let mut out: Vec<Option<Result<RenewResult>>> = reqs.iter().map(|_| None).collect();
    for (i, answer) in batched.iter().zip(folded).chain(singly.iter().zip(each)) {
        out[*i] = Some(answer);
    }
    out.into_iter()
        .map(|answer| {
            answer.unwrap_or_else(|| {
                Err(Error::backend(
                    "a renewal of the batch got no answer (a bug in the backend)",
                ))
            })
        })
        .collect()
}
