"""The third generation of composed data, for a Needle 3 default model (issue 35): the
second generation (compose.py) widened so that a small model learns to read tool
schemas rather than memorise the 27 tools of the demo.

What it adds to compose.example2, every draw on the training side of the stable hash
(gen_data.is_heldout), so test2.jsonl and unseen.jsonl keep measuring unseen parts:

* **synthetic tools**: names, descriptions and parameter sets composed from templates
  across domains (verbs x objects, a share of them made-up words, parameters of every
  JSON type with their own labels); the query names the action in words and gives the
  values with phrases built from the parameter's label, so the model has to match the
  query to the schema it is shown;
* **near-miss tools**: declared tools that share the object or the family of the asked
  one (reserve_table vs cancel_table; set_alarm vs set_timer): either the right one is
  among them and must be picked, or it is not and the answer is a refusal;
* **negations and empty requests**: "don't set an alarm" (the tool declared, nothing
  called), "don't call Ana, text her instead ..." (only the second request called),
  "cancel nothing", "never mind";
* **more phrasings and value forms**: request wrappers ("I want to ...", "could you
  ... for me"), dates said as "the 5th of March" / "Mar 5th" (the canonical "March 5" in
  the answer), counts said as "a dozen" / "a couple", and a larger share of names,
  places and texts in other scripts.

Never in training: the six UNSEEN_TOOLS of compose.py and the tools of the official
acceptance environments (OFFICIAL_ENV_TOOLS, from cactus-needle 3.2.8's
needle/environments) are excluded from the synthetic names; the demo's own 27 tools keep
their names (six share a name, not a schema, with an official tool: set_timer,
set_thermostat, create_reminder, create_note, play_music, set_volume).

    python train/compose3.py --out train/data --train 60000 --seed 7   # writes train3.jsonl
"""
import argparse
import json
import os
import random

import compose as C
import gen_data as G

OFFICIAL_ENV_TOOLS = frozenset("""control_lights set_thermostat control_fan control_blinds
start_robot_vacuum set_oven control_coffee_maker start_dishwasher set_cooking_timer
get_appliance_status play_music pause_media resume_media skip_track set_volume set_timer
create_reminder create_calendar_event add_task create_note reply_to_notification
dismiss_notification start_workout end_workout find_my_phone create_contact log_expense
log_meal log_water_intake log_weight""".split())

# objects the unseen tools act on: no synthetic tool acts on them either, so "reserve a
# flight" or "log a workout" stays as new in unseen.jsonl as "book_flight" itself
UNSEEN_OBJECTS = frozenset(["flight", "shopping_list", "workout", "expense", "fan",
                            "recipe", "shopping", "groceries"])

# --------------------------------------------------------------------------------------
# Synthetic tools
# --------------------------------------------------------------------------------------

# verb -> how a request says it (first person imperative)
VERBS = {"book": "book", "reserve": "reserve", "order": "order", "track": "track",
         "cancel": "cancel", "check": "check", "schedule": "schedule", "rate": "rate",
         "share": "share", "archive": "archive", "start": "start", "stop": "stop",
         "open": "open", "find": "find", "list": "list", "update": "update", "renew": "renew",
         "pay": "pay", "mute": "mute", "lock": "lock", "unlock": "unlock", "rename": "rename",
         "delete": "delete", "create": "create", "request": "request", "submit": "submit",
         "pause": "pause", "resume": "resume", "print": "print", "scan": "scan",
         "water": "water", "feed": "feed", "charge": "charge", "refill": "refill",
         "report": "report", "register": "register", "join": "join", "leave": "leave",
         "add": "add", "remove": "remove", "get": "get", "show": "show", "restart": "restart",
         "sync": "sync", "backup": "back up", "download": "download", "upload": "upload"}

# domain -> objects (snake_case; the request says them with spaces)
DOMAINS = {
    "dining": ["table", "takeaway", "delivery", "coffee_order", "meal_plan", "wine"],
    "travel": ["hotel_room", "train_ticket", "rental_car", "parking_spot", "bus_pass",
               "ferry_seat", "visa_appointment", "luggage"],
    "home": ["sprinkler", "pet_feeder", "garage_door", "doorbell", "smart_plug", "boiler",
             "air_purifier", "robot_mower", "window_shades", "water_heater", "alarm_system"],
    "car": ["car_charger", "car_heater", "trunk", "car_wash", "oil_change", "tire_check"],
    "office": ["printer_job", "meeting_room", "expense_report", "timesheet", "ticket",
               "invoice", "badge", "desk", "vpn", "shared_drive"],
    "health": ["prescription", "doctor_appointment", "sleep_log", "blood_pressure",
               "medication", "therapy_session", "vaccination"],
    "media": ["podcast", "audiobook", "playlist", "episode", "radio_station", "photo_album",
              "video", "subtitle", "livestream"],
    "finance": ["bill", "transfer", "subscription", "budget", "savings_goal", "card",
                "tax_return", "loan_payment"],
    "learning": ["library_book", "course", "lesson", "flashcards", "exam", "homework"],
    "social": ["post", "group_chat", "friend_request", "event_invite", "story", "poll"],
    "errands": ["package", "parcel", "laundry", "dry_cleaning", "pharmacy_pickup",
                "repair", "key_copy", "appointment"],
    "sport": ["gym_class", "tennis_court", "bike", "swim_lane", "match", "training_plan"],
}

DESCRIPTIONS = ["{V} {a} {o}.", "{V} the user's {o}.", "{V} {a} {o} for the user.",
                "Use this to {v} {a} {o}.", "{V} {o}s.", "{V} one {o} by name or id.",
                "Lets the assistant {v} {a} {o}.", "{V} {a} {o} ({d})."]


def article(word):
    return "an" if word[:1].lower() in "aeiou" else "a"


def _value_person(p):
    return p.person()


def _value_city(p):
    return p.city()


def _value_date(p):
    return p.date()


def _value_clock(p):
    return p.clock()


def _value_text(p):
    return p.value(G.MESSAGE_HEADS + G.NOTE_ITEMS + G.EVENT_TITLES)


def _value_title(p):
    return p.value(G.EVENT_TITLES + G.SUBJECTS + G.SEARCHES)


def _value_code(p):
    return p.draw(lambda r: "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(2))
                  + "-" + str(r.randint(100, 9999)))


def _value_email(p):
    return p.email(p.value(G.FIRST))


def _value_place(p):
    return p.value(G.VENDORS + G.ROOMS) if p.r.random() < 0.6 else p.city()


# parameter kinds: (candidate names, JSON type, description, value, phrases with {l} for
# the label words and {v} for the value); the label is the parameter name in words, so
# the query carries what the schema calls it
PARAM_KINDS = [
    (["name", "contact", "person", "recipient", "guest", "owner", "assignee", "patient"],
     "string", "Who it is for", _value_person,
     ["for {v}", "{l} {v}", "with {v}", "{l}: {v}", "for my {l} {v}"]),
    (["city", "location", "destination", "origin", "where", "address_city"],
     "string", "City or place", _value_city,
     ["in {v}", "{l} {v}", "at {v}", "{l}: {v}", "for {v}"]),
    (["date", "day", "when", "start_date", "due_date", "deadline"],
     "string", "Day, e.g. tomorrow or March 5", _value_date,
     ["{v}", "on {v}", "{l} {v}", "for {v}", "{l}: {v}"]),
    (["time", "start_time", "at", "pickup_time", "slot"],
     "string", "Time of day, e.g. 7:30 pm", _value_clock,
     ["at {v}", "{l} {v}", "for {v}", "{l}: {v}"]),
    (["note", "message", "comment", "text", "reason", "caption", "body"],
     "string", "Free text", _value_text,
     ["saying {v}", "with the {l} {v}", "{l}: {v}", "{l} \"{v}\"", "that says {v}"]),
    (["title", "label", "topic", "subject", "query", "item_name"],
     "string", "Short title", _value_title,
     ["called {v}", "{l} {v}", "named {v}", "{l}: {v}", "about {v}"]),
    (["reference", "order_id", "booking_code", "ticket_id", "tracking_number", "account"],
     "string", "Identifier code", _value_code,
     ["{l} {v}", "number {v}", "{l}: {v}", "#{v}", "with {l} {v}"]),
    (["email", "email_address", "notify_email"],
     "string", "Email address", _value_email,
     ["to {v}", "{l} {v}", "at {v}"]),
    (["venue", "place", "shop", "provider", "store", "room"],
     "string", "Where, by name", _value_place,
     ["at {v}", "{l} {v}", "from {v}", "{l}: {v}"]),
]
INT_KINDS = [  # (names, description, lo, hi, phrases)
    (["count", "quantity", "people", "party_size", "copies", "seats"], "How many", 1, 20,
     ["for {v}", "{l} {v}", "x{v}", "{v} {l}", "{l}: {v}"]),
    (["minutes", "duration_minutes", "length_minutes"], "Duration in minutes", 5, 180,
     ["for {v} minutes", "{l} {v}", "{v} min"]),
    (["level", "speed", "intensity", "floor", "priority_level", "volume"], "Level", 0, 10,
     ["to {v}", "{l} {v}", "at {l} {v}", "on {v}"]),
    (["days", "nights", "weeks", "rounds"], "How many", 1, 30,
     ["for {v} {l}", "{l} {v}", "{v} {l}"]),
]
NUM_KINDS = [
    (["amount", "price", "budget", "limit", "total", "max_price"], "Amount of money", None,
     ["{v}", "for {v}", "{l} {v}", "of {v}", "{l}: {v}"]),
    (["weight_kg", "distance_km", "temperature", "percent"], "A measurement", None,
     ["{l} {v}", "to {v}", "at {v}"]),
]
ENUM_KINDS = [
    (["priority"], ["low", "normal", "high", "urgent"], ["{v} {l}", "{l} {v}", "as {v}"]),
    (["size"], ["small", "medium", "large", "extra large"], ["{v}", "{l} {v}", "in {v}"]),
    (["mode"], ["eco", "turbo", "quiet", "auto", "manual"], ["in {v} mode", "{l} {v}", "on {v}"]),
    (["color", "colour"], ["red", "blue", "green", "white", "black", "yellow", "purple"],
     ["in {v}", "{l} {v}", "{v} one"]),
    (["frequency", "repeat"], ["daily", "weekly", "monthly", "never"],
     ["{v}", "repeat {v}", "{l} {v}"]),
    (["payment_method", "method"], ["card", "cash", "transfer", "voucher"],
     ["by {v}", "pay with {v}", "{l} {v}"]),
    (["visibility", "audience"], ["public", "private", "friends"],
     ["{v}", "as {v}", "{l} {v}"]),
]
BOOL_KINDS = [  # (names, description, phrase when true, phrase when false)
    (["notify", "send_notification"], "Whether to notify", ["and notify me", "with a notification"],
     ["without notifying me", "no notification"]),
    (["urgent", "express", "rush"], "Faster handling", ["{l}", "make it {l}", "as {l}"],
     ["not {l}", "no {l}"]),
    (["recurring", "repeat"], "Repeat it", ["recurring", "and repeat it"], ["just once", "one time only"]),
]


def _label(name):
    return name.replace("_", " ")


class SyntheticTool:
    """One composed tool: its schema and how to phrase a request for it."""

    def __init__(self, name, verb, obj, description, params, required):
        self.name, self.verb, self.obj = name, verb, obj
        self.params, self.required = params, required      # params: name -> spec
        props = {}
        for pname, spec in params.items():
            props[pname] = spec["schema"]
        self.schema = {"name": name, "description": description,
                       "parameters": G.obj(props, required)}

    def request(self, p):
        """(query fragment, arguments): every required parameter and a random share of
        the optional ones, each said with a phrase built from its label."""
        said = list(self.required) + [n for n in self.params if n not in self.required
                                      and p.r.random() < 0.45]
        p.r.shuffle(said)
        args, parts = {}, []
        for n in said:
            spec = self.params[n]
            value, phrase = spec["draw"](p)
            args[n] = value
            parts.append(phrase)
        obj = _label(self.obj)
        head = p.r.choice([f"{VERBS[self.verb]} the {obj}", f"{VERBS[self.verb]} {article(obj)} {obj}",
                           f"{VERBS[self.verb]} my {obj}", f"{VERBS[self.verb]} {obj}"])
        q = head
        for part in parts:
            q += p.r.choice([" ", " ", ", "]) + part
        return q, args


def _string_param(p, kind):
    names, typ, desc, value, phrases = kind
    name = p.r.choice(names)
    label = _label(name)

    def draw(pp):
        v = value(pp)
        return v, pp.r.choice(phrases).format(l=label, v=v)
    return name, {"schema": {"type": "string", "description": desc}, "draw": draw}


def _int_param(p, kind):
    names, desc, lo, hi, phrases = kind
    name = p.r.choice(names)
    label = _label(name)

    def draw(pp):
        v = pp.int_in(lo, hi)
        return v, pp.r.choice(phrases).format(l=label, v=v)
    return name, {"schema": G.I(desc, lo, hi), "draw": draw}


def _num_param(p, kind):
    names, desc, _, phrases = kind
    name = p.r.choice(names)
    label = _label(name)

    def draw(pp):
        v = pp.amount() if "price" in name or name in ("amount", "budget", "limit", "total") \
            else pp.draw(lambda r: round(r.randint(10, 9999) / 10, 1))
        return v, pp.r.choice(phrases).format(l=label, v=v)
    return name, {"schema": G.N(desc), "draw": draw}


def _enum_param(p, kind):
    names, values, phrases = kind
    name = p.r.choice(names)
    label = _label(name)
    vals = p.r.sample(values, p.r.randint(2, len(values)))

    def draw(pp):
        v = pp.r.choice(vals)
        return v, pp.r.choice(phrases).format(l=label, v=v)
    return name, {"schema": G.E(f"The {label}", vals), "draw": draw}


def _bool_param(p, kind):
    names, desc, yes, no = kind
    name = p.r.choice(names)
    label = _label(name)

    def draw(pp):
        v = pp.r.random() < 0.5
        return v, pp.r.choice(yes if v else no).format(l=label)
    return name, {"schema": G.B(desc), "draw": draw}


RESERVED = OFFICIAL_ENV_TOOLS | frozenset(G.TOOLS) | frozenset(C.UNSEEN_TOOLS)


def synthetic_tool(p, verb=None, obj=None):
    """A tool composed from the templates above (None when the draw hits a reserved name:
    the caller draws again)."""
    r = p.r
    domain = r.choice(sorted(DOMAINS))
    if obj is None:
        if r.random() < 0.2:
            # a made-up object: only the schema says what it is
            obj = G.pseudo_word(r, "thing") + (r.choice(["", "_" + r.choice(["pod", "hub", "box", "unit", "pass"])]))
        else:
            obj = r.choice(DOMAINS[domain])
    verb = verb or r.choice(sorted(VERBS))
    name = f"{verb}_{obj}"
    if name in RESERVED or obj in UNSEEN_OBJECTS or any(u in name for u in UNSEEN_OBJECTS):
        return None
    desc = r.choice(DESCRIPTIONS).format(V=VERBS[verb].capitalize(), v=VERBS[verb],
                                         o=_label(obj), a=article(obj), d=domain)
    makers = ([(_string_param, k) for k in PARAM_KINDS] * 2 + [(_int_param, k) for k in INT_KINDS]
              + [(_num_param, k) for k in NUM_KINDS] + [(_enum_param, k) for k in ENUM_KINDS]
              + [(_bool_param, k) for k in BOOL_KINDS])
    params = {}
    for make, kind in r.sample(makers, r.randint(1, 4)):
        pname, spec = make(p, kind)
        if pname not in params:
            params[pname] = spec
    names = list(params)
    required = sorted(r.sample(names, r.randint(1, min(2, len(names)))), key=names.index)
    return SyntheticTool(name, verb, obj, desc, params, required)


def draw_synthetic(p, **kw):
    while True:
        t = synthetic_tool(p, **kw)
        if t is not None:
            return t


def siblings(p, tool, k):
    """k synthetic tools close to `tool`: the same object with another verb, or the same
    verb on another object of its domain."""
    out, names = [], {tool.name}
    for _ in range(20 * k):
        if len(out) >= k:
            break
        if p.r.random() < 0.7:
            t = synthetic_tool(p, obj=tool.obj)
        else:
            t = synthetic_tool(p, verb=tool.verb)
        if t is not None and t.name not in names:
            names.add(t.name)
            out.append(t)
    return out


# --------------------------------------------------------------------------------------
# Phrasings and value forms
# --------------------------------------------------------------------------------------

WRAPPERS = ["I want to {q}", "I'd like to {q}", "need to {q}", "I need you to {q}",
            "could you {q} for me", "can you {q} real quick", "help me {q}", "let's {q}",
            "time to {q}", "go {q}", "{q} for me", "{q}, would you", "{q} if you can",
            "try to {q}", "I was hoping you could {q}", "mind helping me {q}",
            "{q} when you get a sec", "remember to {q}", "please just {q}", "{q} now"]

NEGATED = ["don't {q}", "do not {q}", "no need to {q}", "actually, don't {q}",
           "never mind, don't {q}", "please don't {q}", "you don't have to {q}",
           "forget it, do not {q}", "I don't want you to {q}", "there's no need to {q}",
           "stop, don't {q}", "not now, don't {q}"]
# "don't A, B instead": only B is called
INSTEAD = ["don't {a}, {b} instead", "don't {a}; {b}", "{b} but don't {a}",
           "{b}, and don't {a}", "not {a}, just {b}", "instead of that, {b} and don't {a}",
           "rather than {a}, {b}", "skip that: don't {a}, {b}"]
EMPTY = ["cancel nothing", "do nothing", "never mind", "nothing for now", "forget it",
         "ignore that", "no thanks", "nah, I'm good", "nothing, thanks", "all good, nothing",
         "scratch that", "not right now", "don't do anything", "hold on, nothing yet",
         "leave everything as it is", "no changes please", "that's all, nothing else",
         "oops, wrong button", "nvm", "no need for anything"]
# requests whose fragment starts with a verb can be negated as they stand
VERB_HEADS = frozenset("""set turn switch send text call ring play put create add make remind
book get start open mute convert translate search find look save email dim message tell
schedule note write navigate order show check change raise lower give drop sms block lock
unlock reserve track cancel rate share archive stop list update renew pay rename delete
request submit pause resume print scan water feed charge refill report register join leave
remove restart sync back download upload""".split())

COUNTS = {2: ["a couple of", "a pair of", "two"], 12: ["a dozen", "twelve"], 3: ["a few", "three"],
          6: ["half a dozen", "six"]}
DAY_ORD = {1: "st", 2: "nd", 3: "rd", 21: "st", 22: "nd", 23: "rd"}


def date_forms(canonical):
    """Ways to write a date whose canonical form is gen_data's ("March 5", "tomorrow")."""
    parts = canonical.split(" ")
    if len(parts) == 2 and parts[0] in G.MONTHS and parts[1].isdigit():
        m, d = parts[0], int(parts[1])
        o = f"{d}{DAY_ORD.get(d, 'th')}"
        return [f"{m} {o}", f"{d} {m}", f"the {o} of {m}", f"{m[:3]} {d}", f"{m[:3]} {o}",
                f"{o} {m}"]
    return {"tomorrow": ["tmrw", "tmr", "tomorow", "tomorrow"],
            "today": ["today", "tday", "later today"],
            "tonight": ["tonight", "2nite", "this evening"]}.get(canonical, [canonical])


class Pools3(C.Pools2):
    """Training draws of the third generation: Pools2's, with more surface forms."""

    INTL = 0.45

    def __init__(self, rng):
        super().__init__("train", rng)

    def date(self):
        d = super().date()
        if self.r.random() < 0.4:
            forms = [f for f in date_forms(d) if f != d]
            if forms:
                return C.Said(d, self.r.choice(forms))
        return d

    def int_in(self, lo, hi):
        v = super().int_in(lo, hi)
        if int(v) in COUNTS and self.r.random() < 0.4:
            return C.SaidInt(int(v), self.r.choice(COUNTS[int(v)]))
        return v


# --------------------------------------------------------------------------------------
# Examples
# --------------------------------------------------------------------------------------

def _demo_fragment(p, names, verb_first=False):
    for _ in range(50):
        n = p.r.choice(names)
        frag, args = G.PHRASES[n](p)
        if not verb_first or frag.split(" ")[0].lower() in VERB_HEADS:
            return n, frag, args
    raise C.HeldoutExhausted()


def _dress_negated(p, q, calls):
    """p.dress for a request that starts with a negation: a politeness phrase in front of
    it ("can you don't ...") is not English, so such a dressing is drawn again."""
    head = " ".join(q.lower().split(" ")[:2])
    for _ in range(8):
        d = p.dress(q, calls)
        if not any(f"{x.lower()} {head}" in d.lower() for x in C.POLITE_BEFORE):
            return d
    return q


def _declare(p, called, pool, lo, hi):
    extra = [t for t in pool if t not in called]
    k = max(0, p.tool_count(max(1, min(lo, 5)), 5) - len(called))
    declared = list(called) + p.r.sample(extra, min(k, len(extra)))
    p.r.shuffle(declared)
    return declared


# The bands of example3's draw whose answer is a refusal: the right tool absent, a negated
# request, nothing asked.
REFUSAL_BANDS = [(0.68, 0.74), (0.78, 0.82), (0.86, 0.89)]


# Demo tools that no synthetic request fits: the catch-alls (search_web, create_event,
# create_note, create_reminder, record_booking, record_invoice, play_music, book_ride,
# get_directions) are left out, so an unrelated request among these is a refusal.
UNRELATED_DEMO = ["set_timer", "set_alarm", "set_lights", "set_thermostat", "set_brightness",
                  "set_volume", "set_wifi", "set_do_not_disturb", "get_weather", "get_stock_price",
                  "convert_currency", "convert_units", "translate_text", "make_call", "send_message",
                  "send_email", "find_contact", "save_contact"]


def _unrelated(p):
    """A request for a tool that is not declared, among demo tools of other domains: a
    refusal (held-out unseen.jsonl asks for expenses, recipes and flights this way, and
    cycle 2 answered them with the nearest demo tool)."""
    t = draw_synthetic(p)
    frag, _ = t.request(p)
    declared = [G.TOOLS[x] for x in p.r.sample(UNRELATED_DEMO, p.tool_count(1, 5))]
    return p.dress(frag, []), declared, []


def example3(p, names, refusal_boost=0.0, unrelated=0.0):
    """One third-generation example: (query, declared schemas, calls). With refusal_boost b,
    a share b of the draws lands uniformly in REFUSAL_BANDS instead; with `unrelated` u, a
    share u is an unrelated request among demo tools (_unrelated). b = u = 0 draws exactly
    what the first cycle drew: no extra random number is taken."""
    if unrelated and p.r.random() < unrelated:
        return _unrelated(p)
    r = p.r.random()
    if refusal_boost and p.r.random() < refusal_boost:
        width = sum(hi - lo for lo, hi in REFUSAL_BANDS)
        x = p.r.random() * width
        for lo, hi in REFUSAL_BANDS:
            if x < hi - lo:
                r = lo + x
                break
            x -= hi - lo
    if r < 0.35:                                   # the second generation as it is
        q, declared, calls = C.example2(p, names)
        return q, [C.schema(d) for d in declared], calls
    if r < 0.62:                                   # synthetic tools, 1-2 calls
        tools = [draw_synthetic(p)]
        if p.r.random() < 0.2:
            t = draw_synthetic(p)
            if t.name != tools[0].name:
                tools.append(t)
        frags, calls = [], []
        for t in tools:
            frag, args = t.request(p)
            frags.append(frag)
            calls.append({"name": t.name, "arguments": args})
        q = frags[0]
        for f in frags[1:]:
            q += p.pick(C.RUNON) + f
        others = [G.TOOLS[n] for n in p.r.sample(names, p.r.randint(0, 2))]
        others += [draw_synthetic(p).schema for _ in range(p.r.randint(0, 2))]
        declared = [t.schema for t in tools] + [o for o in others
                                                 if o["name"] not in {t.name for t in tools}]
        p.r.shuffle(declared)
        return p.dress(q, calls), declared, calls
    if r < 0.68:                                   # near miss, the right one declared
        t = draw_synthetic(p)
        frag, args = t.request(p)
        calls = [{"name": t.name, "arguments": args}]
        declared = [t.schema] + [s.schema for s in siblings(p, t, p.r.randint(1, 3))]
        p.r.shuffle(declared)
        return p.dress(frag, calls), declared, calls
    if r < 0.74:                                   # near miss, the right one absent
        t = draw_synthetic(p)
        frag, _ = t.request(p)
        declared = [s.schema for s in siblings(p, t, p.r.randint(1, 3))]
        if not declared:
            raise C.HeldoutExhausted()
        return p.dress(frag, []), declared, []
    if r < 0.78:                                   # demo tool among its own family
        fams = [sorted(s) for s in G.SIMILAR]
        fam = p.r.choice(fams)
        n = p.r.choice(fam)
        frag, args = G.PHRASES[n](p)
        calls = [{"name": n, "arguments": args}]
        declared = [G.TOOLS[x] for x in _declare(p, fam, names, len(fam), 5)]
        return p.dress(frag, calls), declared, calls
    if r < 0.82:                                   # a negated request: nothing called
        n, frag, _ = _demo_fragment(p, names, verb_first=True)
        q = p.pick(NEGATED).format(q=frag)
        declared = [G.TOOLS[x] for x in _declare(p, [n], names, 1, 4)]
        return _dress_negated(p, q, []), declared, []
    if r < 0.86:                                   # "don't A, B instead": B only
        a, fa, _ = _demo_fragment(p, names, verb_first=True)
        b, fb, args = _demo_fragment(p, [x for x in names if x != a])
        q = p.pick(INSTEAD).format(a=fa, b=fb)
        calls = [{"name": b, "arguments": args}]
        declared = [G.TOOLS[x] for x in _declare(p, [a, b], names, 2, 5)]
        return _dress_negated(p, q, calls), declared, calls
    if r < 0.89:                                   # nothing asked at all
        declared = [G.TOOLS[x] for x in p.r.sample(names, p.tool_count(1, 5))]
        return p.dress(p.pick(EMPTY), []), declared, []
    # a demo request in a wrapper phrasing
    n, frag, args = _demo_fragment(p, names, verb_first=True)
    calls = [{"name": n, "arguments": args}]
    q = p.pick(WRAPPERS).format(q=frag)
    declared = [G.TOOLS[x] for x in _declare(p, [n], names, 1, 5)]
    return p.dress(q, calls), declared, calls


def make_split3(n, seed, refusal_boost=0.0, unrelated=0.0):
    """n training examples; the same seed (and shares) gives the same examples."""
    p = Pools3(random.Random(seed))
    names = sorted(G.TOOLS)
    seen, out = set(), []
    while len(out) < n:
        try:
            query, declared, calls = example3(p, names, refusal_boost, unrelated)
        except C.HeldoutExhausted:
            continue
        key = query + "|" + ",".join(d["name"] for d in declared)
        if key in seen:
            continue
        seen.add(key)
        out.append({"query": query, "tools": declared, "answers": C.plain(calls)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "data"))
    ap.add_argument("--train", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--refusal-boost", type=float, default=0.0,
                    help="share of draws that land in a refusal band (0: the first cycle's mix, "
                         "~22%% refusals; 0.15 gives ~34%%, test2's share)")
    ap.add_argument("--unrelated", type=float, default=0.0,
                    help="share of draws that ask for an undeclared tool among unrelated demo "
                         "tools (a refusal; 0: none, as cycles 1-2)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = make_split3(a.train, a.seed, a.refusal_boost, a.unrelated)
    G.write_jsonl(os.path.join(a.out, "train3.jsonl"), rows)
    print(f"wrote {len(rows)} third-generation training examples to "
          f"{os.path.join(a.out, 'train3.jsonl')}")


if __name__ == "__main__":
    main()
