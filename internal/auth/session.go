package auth

// SessionCookie is the name of the web console's sign-in cookie on the API
// listener (internal/console). It holds a session id that the daemon maps
// to a token, so the preview proxy strips it before a request reaches an
// app in a VM, like its own cookie.
const SessionCookie = "agentvm_session"
