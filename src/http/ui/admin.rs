//! Admin actions from the UI: force-release, behind the admin sign-in, a
//! CSRF token and a confirmation that asks for a reason.

use axum::Extension;
use axum::extract::{Form, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::format::resource_href;
use super::session::check_csrf;
use super::{UiError, Viewer, resource_name};
use crate::domain::Reason;
use crate::http::AppState;
use crate::store::ForceReleaseOutcome;

/// Who the event log names as having done it.
const ACTOR: &str = "admin (web ui)";

#[derive(Deserialize)]
pub struct ForceReleaseForm {
    csrf: String,
    reason: String,
    /// The confirmation checkbox.
    confirm: Option<String>,
}

pub async fn force_release(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    Path(raw_name): Path<String>,
    Form(form): Form<ForceReleaseForm>,
) -> Result<Response, UiError> {
    check_csrf(&viewer, &form.csrf)?;
    if !viewer.admin {
        return Err(UiError::new(
            StatusCode::UNAUTHORIZED,
            "sign in with the admin token to force-release a lock",
        ));
    }
    let name = resource_name(raw_name)?;
    if form.confirm.as_deref() != Some("yes") {
        return Err(UiError::bad_request(
            "tick the confirmation box to force-release the lock",
        ));
    }
    let reason = Reason::parse(form.reason.trim().to_owned())?;
    let href = resource_href(name.as_str());
    let notice = match state.service.force_release(&name, &reason, ACTOR).await? {
        ForceReleaseOutcome::Released(lease) => {
            tracing::info!(
                resource = %name.as_str(),
                token = lease.token.get(),
                "lease force-released from the web UI"
            );
            "force_released"
        }
        ForceReleaseOutcome::NotHeld => "not_held",
        ForceReleaseOutcome::ResourceNotFound => {
            return Err(UiError::not_found(
                "no resource by that name has ever been used",
            ));
        }
    };
    Ok(Redirect::to(&format!("{href}?notice={notice}")).into_response())
}
