/* The envelope's "validation": whether the calls of a turn are supported by its input.
 *
 *   "validation":{"ungrounded":["tool.path",...],"negation":bool}
 *
 * ungrounded lists, as "NAME.path" (path: key, key.sub, key[0]), every argument value
 * the input (the turn's text and the system facts) does not support. A value is supported
 * when, after normalization (case folded; Latin diacritics folded on both sides, so a value
 * is found whether or not the user typed its accents; apostrophes dropped; every other
 * non-letter, non-digit byte a word break):
 *   - a string: its words appear in the input as a contiguous run of words (a string
 *     with no letter or digit, such as "" or "?!", copies nothing and is never supported);
 *   - a number: the input writes it in digits ("1,500", "2.5", "-3", "5th", "25%"), in words
 *     ("twenty five", "a dozen", "half an hour"), or in another unit of a quantity it
 *     writes (90 seconds = 1.5 minutes; 2 hours = 120 minutes; 1.5 kg = 1500 g; 5 pm = 17;
 *     35 percent = 0.35);
 *   - an enum value (schema "enum"): the value itself (a word form of it: "vacuuming"
 *     supports "vacuum", "living room" supports "living_room") or one of its synonyms from
 *     the table in validation.c appears.
 * Always supported: booleans, null, a value equal to the schema's "default" or
 * "const", an enum with one value, and strings the model resolves rather than copies:
 * formats date, date-time, time, duration, and values shaped like an ISO date or a clock
 * time (the Python package checks a date's year against the input, as the official does).
 *
 * negation: the query negates the action it asks for: a clause of it begins (after fillers
 * and a subject: "please", "just", "I", "we") with a negation cue ("don't", "do not",
 * "never", "no need to", "let's not", "stop/keep/prevent ... from") scoping over a verb,
 * and no other clause is an imperative request. A negative word elsewhere ("it's not done
 * yet, set a timer") or a cue over a non-action verb ("don't forget to ...", "don't
 * worry") is not a negated request. Tool-result turns are never negated. */
#ifndef NEEDLE_AGENT_VALIDATION_H
#define NEEDLE_AGENT_VALIDATION_H

#include "util/strbuf.h"

/* Appends the validation object (JSON, as above) to out. tools_json: the tool schemas
 * (an array of {name, parameters} or OpenAI-style {"function": {...}}); system and text
 * may be NULL; calls_json: the call array (NULL or malformed: no calls). is_query: the
 * text is a user query (negation is looked for only there). Never fails beyond out->oom:
 * what cannot be parsed is left out. */
void validation_write(const char *tools_json, const char *system, const char *text,
                      int is_query, const char *calls_json, strbuf *out);

/* The negation rule alone, on a UTF-8 query. */
int validation_negated(const char *query);

#endif
