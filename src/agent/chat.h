/* Conversation state attached to a session by needle_session_set_tools (see chat.c). */
#ifndef NEEDLE_AGENT_CHAT_H
#define NEEDLE_AGENT_CHAT_H

#include "needle.h"

struct chat;

void chat_free(struct chat *c);
/* Returns the conversation to the end of the cached static prefix. */
void chat_rewind(needle_session *s);

#endif
