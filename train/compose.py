"""The second generation of the demo model's data (issue 18): requests composed from
independent phrasing parts, values in the surface forms people type with the schema's
canonical value in the answer, names, places and text in many scripts, two- and
three-call requests, refusals with near-miss distractors, and two held-out sets:

* `test2`: the held-out side of every phrasing part, value pool, template list and tool
  combination (no fallback to the training side: a draw with no held-out option is
  redrawn), so none of its parts occurs in training;
* `unseen`: requests for tools that no training example declares (UNSEEN_TOOLS).

gen_data.py's first-generation test split (train/data/test.jsonl) is left exactly as it
was: everything here is reached only through `Pools2`, never through `Pools`.
"""
import random

import gen_data as G

# --------------------------------------------------------------------------------------
# Values in many scripts. Split by the same stable hash as every pool: one in seven is
# held out.
# --------------------------------------------------------------------------------------

INTL_FIRST = """Łukasz Zoë Małgorzata Wojciech Agnieszka Zbigniew Ştefan Çağla Gökhan Şebnem
Ayşe Oğuz İlkay Nguyễn Thảo Phương Đức Quỳnh Huệ Γιώργος Ελένη Δημήτρης Σοφία Νίκος
Αθηνά Алексей Наталья Дмитрий Ольга Сергей Юлия 王芳 李娜 张伟 陈静 刘洋 田中 さくら 健太
José María Sérgio Inês João Zoé Françoise Hélène Jürgen Björn Søren Åsa Dóra Ágnes
Ñusta Renée Chloé Anaïs Mihály Tomáš Jiří Dvořák Žofie Niamh Siobhán Eóin Þóra Guðrún
Ngọc Tuấn Hồng Jörg Günther Sinéad Øystein Ælfric Mário Gonçalo Leilani Kalani""".split()
INTL_LAST = """Kowalski Wiśniewska Dąbrowski Łęcka Zieliński Yılmaz Öztürk Şahin Çelik Doğan
Kılıç Trần Lê Phạm Hoàng Vũ Đặng Παπαδόπουλος Οικονόμου Κωνσταντίνου Иванов Смирнова
Кузнецов Попова Соколов Müller Groß Schäfer Bøe Ødegaard Åberg Núñez Peña García Méndez
Gonçalves Simões Fernández Lefèvre Gauthier Hernández Ó_Briain Mac_Giolla Kovač Horváth
Novák Dvořáková Sørensen Jóhannsdóttir Þórsson 佐藤 鈴木 高橋""".split()
INTL_LAST = [n.replace("_", " ") for n in INTL_LAST]
INTL_CITIES = """Łódź São_Paulo Zürich Kraków Gdańsk Wrocław İstanbul İzmir Eskişehir Muğla
Hà_Nội Đà_Nẵng Huế Hải_Phòng Αθήνα Θεσσαλονίκη Πάτρα Москва Санкт-Петербург Новосибирск
Київ Львів 東京 大阪 北京 上海 서울 부산 München Köln Düsseldorf Malmö Göteborg Århus
Tromsø Reykjavík Akureyri Bogotá Medellín Ciudad_de_México Cancún Mérida Asunción
Brasília Belém Florianópolis Curaçao Montréal Québec Besançon Orléans Nîmes Coimbra
Évora Poznań Toruń Plzeň Brno Győr Pécs Cluj-Napoca Timișoara Zürichberg Genève
Düsseldorf-Süd Santa_Bárbara Ñuñoa Málaga Cádiz A_Coruña Jönköping Växjö""".split()
INTL_CITIES = [c.replace("_", " ") for c in INTL_CITIES]
INTL_TEXTS = ["dzień dobry", "teşekkürler", "cảm ơn bạn", "καλημέρα", "спасибо большое",
              "ありがとう", "谢谢你", "¿dónde estás?", "à bientôt", "bon appétit",
              "grüß dich", "até logo", "çok güzel", "không sao đâu", "увидимся завтра",
              "παρακαλώ", "乾杯", "see you at Café Zoë 😊", "happy birthday 🎉",
              "running late 🚗", "meet at Łazienki park", "dinner at Ñam Ñam at 8",
              "the crème brûlée was great", "señor Pérez called", "bring the piñata 🎊",
              "gracias por todo", "merci beaucoup", "naïve question: are we still on?",
              "I'm in Zürich until Friday", "the café on Rua Augusta", "ok 👍",
              "love you ❤️", "call when you land ✈️", "the Straße is closed",
              "buy żurek and pierogi", "book the Kraków trip", "pick up the Smørrebrød",
              "renew the résumé", "fix the façade", "order from Phở Hà Nội",
              "Крем для рук", "meet Søren at the fjord", "ticket to Αθήνα",
              "the keys are with Ayşe", "Jürgen's farewell party 🥳"]
# syllables of made-up words with letters outside ASCII: copying them needs byte pieces
INTL_SYLLABLES = ["ła", "śo", "żu", "ğı", "şe", "çö", "ü", "ñe", "ão", "ễ", "ươ", "đa", "ø",
                  "å", "é", "ï", "ő", "ž", "ř", "ß", "κα", "λο", "ми", "ра", "ня", "東", "京"]


class _Spoken:
    """A value whose canonical form goes into the answer (json sees the str/int/float it
    also is) and whose spoken form goes into the query (templates format it)."""
    def __new__(cls, canonical, said):
        s = super().__new__(cls, canonical)
        s.said = said
        return s

    def __format__(self, spec):
        return format(self.said, spec)


class Said(_Spoken, str):
    pass


class SaidInt(_Spoken, int):
    pass


class SaidFloat(_Spoken, float):
    pass


ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
        "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
        "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def words(n):
    """English words for 0 <= n < 1000."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    rest = n % 100
    return ONES[n // 100] + " hundred" + ("" if rest == 0 else " and " + words(rest))


def duration_forms(m):
    """Ways people say a duration of m minutes."""
    forms = [f"{m} minutes" if m != 1 else "1 minute", f"{m} min", f"{m}m"]
    if m < 100:
        forms.append(words(m) + (" minutes" if m != 1 else " minute"))
    h, r = divmod(m, 60)
    if m == 30:
        forms += ["half an hour", "30 mins", "a half hour"]
    if m == 15:
        forms += ["a quarter of an hour", "quarter of an hour"]
    if m == 45:
        forms += ["three quarters of an hour", "45 mins"]
    if h and r == 0:
        forms += ["an hour" if h == 1 else f"{h} hours", f"{h}h",
                  "one hour" if h == 1 else f"{words(h)} hours"]
    if h and r == 30:
        forms += [("an hour" if h == 1 else f"{h} hours") + " and a half", f"{h}.5 hours",
                  f"{h} and a half hours" if h > 1 else "one and a half hours", f"{h}h30"]
    if h and r in (15, 45, 10, 20):
        forms += [("an hour" if h == 1 else f"{h} hours") + f" and {r} minutes", f"{h}h{r}"]
    return forms


def clock_forms(h12, m, ampm):
    """Ways people write a time of day; the canonical form is gen_data's ("7:30 pm",
    "7 pm")."""
    h24 = (h12 % 12) + (12 if ampm == "pm" else 0)
    part = "in the morning" if ampm == "am" else ("in the afternoon" if h24 < 18 else
                                                   "in the evening")
    forms = [f"{h12}:{m:02d}{ampm}", f"{h24:02d}:{m:02d}" if h24 else "00:%02d" % m,
             f"{h12}:{m:02d} {ampm.upper()}", f"{h12}.{m:02d} {ampm}", f"{h12}:{m:02d} {part}"]
    if m == 0:
        forms += [f"{h12}{ampm}", f"{h12} o'clock {part}", f"{words(h12)} {ampm}",
                  f"{h12} {ampm.upper()}"]
    if m == 30:
        forms += [f"half past {h12} {part}", f"half past {words(h12)} {ampm}"]
    if m == 15:
        forms += [f"quarter past {h12} {part}", f"a quarter past {h12} {ampm}"]
    if m == 45:
        nxt = h12 % 12 + 1
        forms += [f"quarter to {nxt} {part}", f"a quarter to {words(nxt)} {ampm}"]
    return forms


def canonical_clock(h12, m, ampm):
    return f"{h12}:{m:02d} {ampm}" if m else f"{h12} {ampm}"


# --------------------------------------------------------------------------------------
# Phrasing parts around a request. Each list is split by hash like the values.
# --------------------------------------------------------------------------------------

OPENERS = ["hey", "hi", "ok so", "hey there", "yo", "hello", "right,", "alright", "so",
           "umm", "quick question,", "listen,", "okay", "excuse me,", "morning!", "hiya",
           "good evening,", "one thing:", "real quick,", "ey", "oi", "well,", "hmm",
           "hey assistant,", "assistant,", "computer,", "hey buddy,", "sorry,",
           "one more thing,", "before I forget,", "btw", "oh and"]
POLITE_BEFORE = ["please", "can you", "could you", "would you", "can u", "could you please",
                 "would you mind to", "pls", "plz", "kindly", "I'd like you to",
                 "I need you to", "i want you to", "do me a favour and", "be a dear and",
                 "if you could", "go ahead and", "mind if you"]
CLOSERS = ["thanks", "thank you", "thx", "ty", "cheers", "thanks a lot", "please",
           "pls", "asap", "right now", "when you can", "if possible", "for me",
           "thank u", "much appreciated", "merci", "ta", "cheers mate", "ok?", "now"]
FILLERS = ["um", "uh", "like", "erm", "you know", "basically", "actually", "just",
           "maybe", "kinda", "I guess", "er"]
RUNON = [" ", " and ", " & ", " + ", ", ", " also ", " and then ", " then ", "; ", " plus ",
         " oh and ", " after that ", " and also ", ". ", " n ", " as well as "]


def typo(r, word):
    """One keyboard slip in a word."""
    if len(word) < 4 or not word.isalpha():
        return word
    i = r.randrange(1, len(word) - 1)
    k = r.random()
    if k < 0.35:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if k < 0.65:
        return word[:i] + word[i + 1:]
    if k < 0.85:
        return word[:i] + word[i] + word[i:]
    return word[:i] + r.choice("aeioustnr") + word[i + 1:]


def protected(args):
    """Words of the answer's values (typos and case changes must not touch them)."""
    out = set()
    for call in args:
        for v in call["arguments"].values():
            if isinstance(v, str):
                out.update(v.lower().split())
            out.add(str(v).lower())
    return out


class HeldoutExhausted(Exception):
    """A held-out draw found no held-out option: the example is redrawn."""


class Pools2(G.Pools):
    """Draws of the second generation (see the module comment). `split` is "train" or
    "test2"/"unseen" (the held-out side)."""

    INTL = 0.3          # share of names, places and texts drawn from the scripts above

    def __init__(self, split, rng):
        super().__init__("test" if split != "train" else "train", rng)
        self.v2 = True

    def pick(self, pool):
        side = [v for v in pool if G.is_heldout(v) == self.test]
        if not side:
            raise HeldoutExhausted()
        return self.r.choice(side)

    def value(self, pool):
        if self.r.random() < 0.12 and pool is not G.CURRENCIES and pool is not G.STOCKS:
            # free text of other scripts, where any text would do
            if pool in (G.MESSAGE_HEADS, G.NOTE_ITEMS, G.TRANSLATE_TEXTS, G.SEARCHES,
                        G.SUBJECTS, G.EVENT_TITLES):
                return self.pick(INTL_TEXTS)
        v = self.pick(pool)
        if self.test or self.r.random() >= self.SYNTHETIC:
            return v
        syl = INTL_SYLLABLES if self.r.random() < 0.3 else None
        return " ".join(self.made_up(w, syl) for w in v.split(" "))

    def made_up(self, like, syllables):
        if syllables is None or like in G.KEEP_WORDS or not like.isalpha() or like.isupper():
            return G.pseudo_word(self.r, like)
        pool = G.SYLLABLES + syllables
        w = "".join(self.r.choice(pool) for _ in range(self.r.randint(2, 3)))
        return w[:1].upper() + w[1:] if like[:1].isupper() else w

    def city(self):
        if self.r.random() < self.INTL:
            return self.pick(INTL_CITIES)
        return super().city()

    def person(self):
        if self.r.random() < self.INTL:
            first = self.pick(INTL_FIRST)
            return first if self.r.random() < 0.5 else first + " " + self.pick(INTL_LAST)
        return super().person()

    def int_in(self, lo, hi):
        v = super().int_in(lo, hi)
        if v < 100 and self.r.random() < 0.25:
            return SaidInt(v, words(v))
        return v

    def duration(self, m):
        m = int(m)
        return self.pick(duration_forms(m)) if self.r.random() < 0.6 else super().duration(m)

    def timer_minutes(self):
        if self.r.random() < 0.5:
            return self.draw(lambda r: r.choice([5, 10, 15, 20, 25, 30, 40, 45, 60, 75, 90,
                                                 105, 120, 150, 180, 240]))
        return super().timer_minutes()

    def clock(self):
        def make(r):
            h = r.randint(1, 12)
            m = r.choice([0, 0, 15, 30, 45, 5, 10, 20, 40, 50])
            return canonical_clock(h, m, r.choice(["am", "pm"]))
        c = self.draw(make)
        if self.r.random() < 0.4:
            return c
        hm, ampm = c.split(" ")
        h, m = (hm.split(":") + ["0"])[:2]
        return Said(c, self.pick(clock_forms(int(h), int(m), ampm)))

    def amount(self):
        v = super().amount()
        k = self.r.random()
        if isinstance(v, int) and v < 1000 and k < 0.2:
            return SaidInt(v, words(v))
        if k < 0.3 and isinstance(v, int) and v >= 1000 and v % 1000 == 0:
            return SaidInt(v, f"{v // 1000}k")
        if k < 0.4 and isinstance(v, int) and v >= 1000:
            return SaidInt(v, f"{v:,}")
        return v

    def dress(self, q, calls):
        """Phrasing parts around a request: opener, politeness, fillers, closer, typos,
        lower case; each independently."""
        r = self.r
        keep = protected(calls)
        # the first word may be a value: its case is then the value's
        free_head = q.split(" ")[0].lower() not in keep and not any(
            q.split(" ")[0].lower() in k for k in keep)
        if r.random() < 0.3:
            q = self.pick(POLITE_BEFORE) + " " + (q[:1].lower() if free_head else q[:1]) + q[1:]
        if r.random() < 0.15:
            ws = q.split(" ")
            i = r.randrange(0, len(ws))
            if ws[i].lower() not in keep:
                ws.insert(i, self.pick(FILLERS))
                q = " ".join(ws)
        if r.random() < 0.3:
            q = self.pick(OPENERS) + " " + q
        if r.random() < 0.25:
            q = q.rstrip(".") + (", " if r.random() < 0.5 else " ") + self.pick(CLOSERS)
        if r.random() < 0.2:
            ws = q.split(" ")
            for _ in range(r.randint(1, 2)):
                i = r.randrange(len(ws))
                if ws[i].lower() not in keep and not any(ws[i].lower() in k for k in keep):
                    ws[i] = typo(r, ws[i])
            q = " ".join(ws)
        if r.random() < 0.35 and (free_head or not q.startswith(q.split(" ")[0])):
            q = q[:1].upper() + q[1:]
        if r.random() < 0.25:
            q += r.choice([".", "!", "?", "!!", " :)", "..."])
        return q


def request(p, names, ncalls):
    called = p.r.sample(names, ncalls)
    if ncalls > 1 and G.is_heldout("+".join(sorted(called))) != p.test:
        raise HeldoutExhausted()            # combinations are split like everything else
    frags, calls = [], []
    for n in called:
        frag, args = PHRASES_FOR(n)(p)
        frags.append(frag)
        calls.append({"name": n, "arguments": args})
    q = frags[0]
    for f in frags[1:]:
        q += p.pick(RUNON) + f
    return q, called, calls


PHRASES_FOR = G.PHRASES.__getitem__


def near_miss(p, want, names, k):
    """k declared tools for a request for `want` that none serves, with a tool of the
    same family among them when there is one (the distractor the model must resist)."""
    fam = [n for n in names if n != want and G._similar(n, want)]
    others = [n for n in names if n != want and not G._similar(n, want)]
    picked = []
    if fam and p.r.random() < 0.6:
        picked.append(p.r.choice(fam))
    picked += p.r.sample(others, max(0, k - len(picked)))
    p.r.shuffle(picked)
    return picked


def example2(p, names):
    """One example of the second generation."""
    r = p.r.random()
    if r < 0.08:
        declared = p.r.sample(names, p.tool_count(1, 5))
        return p.dress(chatter2(p), []), declared, []
    if r < 0.13:
        declared = p.r.sample(names, p.tool_count(1, 5))
        return p.dress(G.off_topic(p), []), declared, []
    if r < 0.24:
        want = p.r.choice(names)
        frag, _ = PHRASES_FOR(want)(p)
        return p.dress(frag, []), near_miss(p, want, names, p.tool_count(1, 4)), []
    ncalls = 3 if r < 0.30 else (2 if r < 0.52 else 1)
    q, called, calls = request(p, names, ncalls)
    extra = [n for n in names if n not in called]
    declared = called + p.r.sample(extra, max(0, p.tool_count(ncalls, 5) - ncalls))
    p.r.shuffle(declared)
    return p.dress(q, calls), declared, calls


def chatter2(p):
    """Off-topic queries from the parts of gen_data.chatter, each part split by hash."""
    while True:
        k = p.r.random()
        if k < 0.35:
            q = p.pick(G.CHAT_ASK).format(t=p.pick(G.CHAT_TOPICS), u=p.pick(G.CHAT_TOPICS))
        elif k < 0.6:
            q = p.pick(G.CHAT_PLAIN)
        elif k < 0.72:
            q = p.pick(G.CHAT_MATH).format(x=p.r.randint(2, 999), y=p.r.randint(2, 999))
        elif k < 0.87:
            place = p.city() if p.r.random() < 0.5 else p.pick(G.COUNTRIES)
            q = p.pick(G.CHAT_ASK_PLACE).format(c=place, m=p.r.choice(G.MONTHS))
        else:
            q = p.pick(G.UNAVAILABLE)
        if not G._leaks_heldout(q):
            return q


# --------------------------------------------------------------------------------------
# Training data for the unseen tools (the README's fine-tuning example): the same six
# schemas, with phrasings, items and categories of their own (none of the templates or
# value lists of the UNSEEN_PHRASES above, which made unseen.jsonl), the training side of
# every shared pool (cities, dates, amounts, rooms, openers, fillers, closers) and known
# tools as distractors. Composed from parts, no LLM. The held-out set stays held out:
# make_unseen_train drops any query that unseen.jsonl has.
# --------------------------------------------------------------------------------------

def _flight_t(p):
    a, b, d = p.city(), p.city(), p.date()
    t = p.r.choice(["reserve a seat on a plane from {a} to {b}, {d}",
                    "book me a flight {a} -> {b} departing {d}",
                    "can you get a flight out of {a} into {b} on {d}",
                    "{d}: flight from {a} to {b} please",
                    "I have to fly {a} to {b} on {d}, book it"])
    return t.format(a=a, b=b, d=d), {"origin": a, "destination": b, "date": d}


def _shopping_t(p):
    item = p.r.choice(["almond milk", "butter", "pasta", "apples", "coffee beans", "yogurt",
                       "toilet paper", "garlic", "brown bread", "spinach", "cheddar",
                       "lemons", "ground coffee", "paper towels", "honey", "oatmeal"])
    if p.r.random() < 0.5:
        n = p.int_in(2, 12)
        t = p.r.choice(["shopping list, add {n} {i}", "{n} {i} on the grocery list please",
                        "remember to buy {n} {i}, put it on the list"])
        return t.format(n=n, i=item), {"item": item, "quantity": n}
    t = p.r.choice(["put {i} on the grocery list", "we ran out of {i}, add it to the list",
                    "add {i} to my list for the store", "grocery list: add {i}"])
    return t.format(i=item), {"item": item}


def _workout_t(p):
    act = p.r.choice(["running", "cycling", "swimming", "yoga", "walking"])
    m = p.r.choice([5, 12, 25, 35, 40, 50, 75, 120])
    d = p.duration(m)
    t = p.r.choice(["log a {a} workout, {d}", "time my {a} session for {d}",
                    "starting {a} now for {d}", "workout tracker: {a}, {d}"])
    return t.format(a=act, d=d), {"activity": act, "minutes": m}


def _expense_t(p):
    amt = p.amount()
    cat = p.r.choice(["coffee", "fuel", "clothes", "insurance", "pets", "travel",
                      "entertainment", "phone bill"])
    t = p.r.choice(["add an expense: {a} on {c}", "note that I paid {a} for {c}",
                    "{c} cost me {a}, log it", "track {a} under {c}"])
    return t.format(a=amt, c=cat), {"amount": amt, "category": cat}


def _fan_t(p):
    room, v = p.value(G.ROOMS), p.r.randint(0, 5)
    t = p.r.choice(["{r} fan on speed {v}", "put the ceiling fan in the {r} at {v}",
                    "change the fan speed in the {r} to {v}"])
    return t.format(r=room, v=v), {"room": room, "speed": v}


def _recipe_t(p):
    dish = p.r.choice(["lasagna", "tikka masala", "goulash", "falafel", "risotto", "tacos",
                       "banana bread", "miso soup", "paneer curry", "gnocchi", "chili",
                       "dumplings"])
    t = p.r.choice(["show me how to cook {d}", "search recipes: {d}", "I want to cook {d} tonight",
                    "get a {d} recipe"])
    return t.format(d=dish), {"dish": dish}


UNSEEN_TRAIN_PHRASES = {"book_flight": _flight_t, "add_to_shopping_list": _shopping_t,
                        "start_workout": _workout_t, "log_expense": _expense_t,
                        "set_fan_speed": _fan_t, "find_recipe": _recipe_t}


def example_unseen_train(p, names, refusals=0.12, near_miss_share=0.0, chatter_share=0.0):
    """example_unseen's mix (by default 12% refusals with the requested tool undeclared,
    18% two calls) over the training phrasings. `refusals`: the refusal share (the
    two-call share stays 18%). Of the refusals, `near_miss_share` declare other new
    tools among the distractors (the tools the fine-tune makes eager: a flight request
    with only the new shopping and fan tools declared must still be refused) and
    `chatter_share` are off-topic chatter with new tools declared. With the defaults it
    is example_unseen's stream, draw for draw."""
    if near_miss_share <= 0 and chatter_share <= 0:
        return example_unseen(p, names, UNSEEN_TRAIN_PHRASES, refusals)
    new = sorted(UNSEEN_TOOLS)
    if p.r.random() >= refusals:
        return example_unseen(p, names, UNSEEN_TRAIN_PHRASES, 0.0)
    k = p.r.random()
    if k < chatter_share:
        declared = p.r.sample(new, p.r.randint(1, 2)) + p.r.sample(names, p.tool_count(1, 3))
        p.r.shuffle(declared)
        return p.dress(chatter2(p), []), declared, []
    want = p.r.choice(new)
    frag, _ = UNSEEN_TRAIN_PHRASES[want](p)
    if k < chatter_share + near_miss_share:
        others = [n for n in new if n != want]
        declared = p.r.sample(others, p.r.randint(1, 2)) + p.r.sample(names, p.tool_count(1, 3))
        p.r.shuffle(declared)
    else:
        declared = p.r.sample(names, p.tool_count(1, 4))
    return p.dress(frag, []), declared, []


def make_unseen_train(n, seed, heldout_queries=(), refusals=0.12, near_miss_share=0.0,
                      chatter_share=0.0):
    """n training examples for the unseen tools (the training side of every pool), none
    of whose queries is in heldout_queries; the refusal knobs as example_unseen_train."""
    banned = set(heldout_queries)

    def make(p, names):
        return example_unseen_train(p, names, refusals, near_miss_share, chatter_share)
    rows = []
    while len(rows) < n:
        more = make_split2("train", n - len(rows), seed, make=make)
        rows += [x for x in more if x["query"] not in banned]
        seed += 1
    return rows[:n]


def make_split2(split, n, seed, names=None, make=example2):
    rng = random.Random(seed)
    p = Pools2(split, rng)
    names = names or sorted(G.TOOLS)
    seen, out = set(), []
    while len(out) < n:
        try:
            query, declared, calls = make(p, names)
        except HeldoutExhausted:
            continue
        key = query + "|" + ",".join(declared)
        if key in seen:
            continue
        seen.add(key)
        out.append({"query": query, "tools": [schema(d) for d in declared],
                    "answers": plain(calls)})
    return out


def plain(x):
    """The answer with the spoken-form wrappers dropped (canonical values only)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    if isinstance(x, bool):
        return x
    for t in (str, int, float):
        if isinstance(x, t):
            return t(x)
    return x


# --------------------------------------------------------------------------------------
# Tools no training example declares: the `unseen` set measures transfer to new schemas.
# --------------------------------------------------------------------------------------

UNSEEN_TOOLS, UNSEEN_PHRASES = {}, {}


def unseen_tool(name, description, params, required):
    def register(gen):
        UNSEEN_TOOLS[name] = {"name": name, "description": description,
                              "parameters": G.obj(params, required)}
        UNSEEN_PHRASES[name] = gen
        return gen
    return register


def schema(name):
    return G.TOOLS[name] if name in G.TOOLS else UNSEEN_TOOLS[name]


def _unseen_pick(p, templates):
    # unseen tools are held out whole: all their templates are fair game
    return p.r.choice(templates)


@unseen_tool("book_flight", "Book a flight between two cities on a date.",
             {"origin": G.S("Departure city"), "destination": G.S("Arrival city"),
              "date": G.S("Travel date")}, ["origin", "destination", "date"])
def _flight(p):
    a, b, d = p.city(), p.city(), p.date()
    t = _unseen_pick(p, ["book a flight from {a} to {b} on {d}", "fly me from {a} to {b} {d}",
                         "I need a plane ticket {a} to {b} for {d}",
                         "get me on a flight to {b} from {a}, {d}"])
    return t.format(a=a, b=b, d=d), {"origin": a, "destination": b, "date": d}


@unseen_tool("add_to_shopping_list", "Add an item to the shopping list.",
             {"item": G.S("What to buy"), "quantity": G.I("How many", 1, 99)}, ["item"])
def _shopping(p):
    item = p.r.choice(["oat milk", "eggs", "żurek", "tomatoes", "rice", "crème fraîche",
                       "batteries", "dish soap", "phở noodles", "bananas", "olive oil", "feta"])
    if p.r.random() < 0.5:
        n = p.int_in(2, 12)
        t = _unseen_pick(p, ["add {n} {i} to the shopping list", "put {n} {i} on my list",
                             "we need {n} {i}, add it to groceries"])
        return t.format(n=n, i=item), {"item": item, "quantity": n}
    t = _unseen_pick(p, ["add {i} to the shopping list", "put {i} on my shopping list",
                         "we're out of {i}", "shopping list: {i}"])
    return t.format(i=item), {"item": item}


@unseen_tool("start_workout", "Start tracking a workout.",
             {"activity": G.E("Kind of workout", ["running", "cycling", "swimming", "yoga",
                                                  "walking"]),
              "minutes": G.I("Planned duration in minutes", 1, 300)}, ["activity"])
def _workout(p):
    act = p.r.choice(["running", "cycling", "swimming", "yoga", "walking"])
    m = p.r.choice([10, 15, 20, 30, 45, 60, 90])
    d = p.duration(m)
    t = _unseen_pick(p, ["start a {a} workout for {d}", "track my {a} for {d}",
                         "I'm going {a} for {d}, log it", "begin {a} session, {d}"])
    return t.format(a=act, d=d), {"activity": act, "minutes": m}


@unseen_tool("log_expense", "Record an expense.",
             {"amount": G.N("Amount spent"), "category": G.S("Spending category"),
              "note": G.S("Optional note")}, ["amount", "category"])
def _expense(p):
    amt = p.amount()
    cat = p.r.choice(["groceries", "transport", "dining", "rent", "utilities", "books",
                      "health", "gifts"])
    t = _unseen_pick(p, ["log {a} for {c}", "I spent {a} on {c}", "expense: {a}, {c}",
                         "record a {c} expense of {a}"])
    return t.format(a=amt, c=cat), {"amount": amt, "category": cat}


@unseen_tool("set_fan_speed", "Set a ceiling fan's speed.",
             {"room": G.S("Room name"), "speed": G.I("Speed level", 0, 5)}, ["room", "speed"])
def _fan(p):
    room, v = p.value(G.ROOMS), p.r.randint(0, 5)
    t = _unseen_pick(p, ["set the {r} fan to {v}", "fan speed {v} in the {r}",
                         "turn the {r} fan to level {v}"])
    return t.format(r=room, v=v), {"room": room, "speed": v}


@unseen_tool("find_recipe", "Find recipes for a dish.",
             {"dish": G.S("Dish name"), "max_minutes": G.I("Longest cooking time", 5, 240)},
             ["dish"])
def _recipe(p):
    dish = p.r.choice(["pierogi", "jollof rice", "phở bò", "moussaka", "borscht", "pad thai",
                   "shakshuka", "bibimbap", "köfte", "paella", "ramen", "crêpes"])
    t = _unseen_pick(p, ["find me a recipe for {d}", "how do I make {d}, find a recipe",
                         "recipe for {d}", "look for {d} recipes"])
    return t.format(d=dish), {"dish": dish}


def example_unseen(p, names, phrases=None, refusals=0.12):
    """A request for one (sometimes two) of the unseen tools among known distractors, or
    a refusal when the requested unseen tool is not declared (`refusals` of them; 18%
    two calls). `phrases`: the phrasing table (default UNSEEN_PHRASES, the held-out
    side)."""
    phrases = phrases or UNSEEN_PHRASES
    new = sorted(UNSEEN_TOOLS)
    r = p.r.random()
    if r < refusals:
        want = p.r.choice(new)
        frag, _ = phrases[want](p)
        return p.dress(frag, []), p.r.sample(names, p.tool_count(1, 4)), []
    called = p.r.sample(new, 2 if r < refusals + 0.18 else 1)
    frags, calls = [], []
    for n in called:
        frag, args = phrases[n](p)
        frags.append(frag)
        calls.append({"name": n, "arguments": args})
    q = frags[0]
    for f in frags[1:]:
        q += p.pick(RUNON) + f
    declared = called + p.r.sample(names, max(0, p.tool_count(len(called), 5) - len(called)))
    p.r.shuffle(declared)
    return p.dress(q, calls), declared, calls
