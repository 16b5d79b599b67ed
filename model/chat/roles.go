package chat

// Roles are the message roles a request may give, in the order errors list
// them.
var Roles = []string{"system", "developer", "user", "assistant", "tool"}

// TemplateRole is the role a request's message has in the chat template:
// OpenAI's "developer" (the system prompt of its newer models) is "system"
// for a template that knows no developer role, as OpenAI maps it for models
// without one; the other roles are themselves. ok is false for a role
// outside Roles. Both APIs (HTTP and gRPC) map roles through it.
func TemplateRole(role string) (string, bool) {
	switch role {
	case "system", "user", "assistant", "tool":
		return role, true
	case "developer":
		return "system", true
	}
	return "", false
}
