"""The Responses API surface (POST/GET/DELETE /v1/responses...): input items
turned into a chat, stored responses, background runs and their events."""
