/* Conversations with tools (chat.c): the public calls are in needle.h
 * (needle_session_set_tools, needle_session_complete, needle_session_prefix_length).
 * The conversation is a layer over the session: its state is attached as the session's
 * extension (model/session.h) and freed with it. */
#ifndef NEEDLE_AGENT_CHAT_H
#define NEEDLE_AGENT_CHAT_H

#include "needle.h"

struct chat;

void chat_free(struct chat *c);

#endif
