"""Synthetic tool-calling data for the demo model, in the official fine-tuning format.

Every line of the output is one example: {"query", "tools", "answers"} (cactus-needle's
`finetune.render_example` turns it into prompt and target). An example declares a
shuffled subset of 1-5 tools, always including the ones its answer calls, so the model
must pick the right tool among distractors and copy argument values out of the query.

The held-out split is built from the same grammar with *disjoint* argument values and
phrasings: every value pool and every template list is partitioned by a stable hash of
its text, one part for training and one for the test split. A model that memorized
values or sentences cannot score on it; one that learned to copy spans can.

    python train/gen_data.py --out train/data --train 60000 --test 600
"""
import argparse
import json
import os
import random
import re
import zlib

# --------------------------------------------------------------------------------------
# Value pools
# --------------------------------------------------------------------------------------

CITIES = """Lagos Paris Tokyo Berlin Madrid Rome Lisbon Dublin Oslo Stockholm Helsinki Vienna
Prague Warsaw Budapest Athens Cairo Nairobi Accra Dakar Casablanca Tunis Johannesburg
Cape_Town Durban Kigali Addis_Ababa Kampala Lusaka Harare Luanda Mumbai Delhi Chennai
Kolkata Bangalore Hyderabad Karachi Lahore Dhaka Colombo Kathmandu Bangkok Hanoi Manila
Jakarta Singapore Kuala_Lumpur Seoul Busan Osaka Kyoto Beijing Shanghai Shenzhen Taipei
Hong_Kong Sydney Melbourne Brisbane Perth Auckland Wellington Toronto Montreal Vancouver
Ottawa Calgary Chicago Boston Seattle Denver Austin Houston Dallas Miami Atlanta Phoenix
Portland San_Diego Los_Angeles San_Francisco New_York Philadelphia Detroit Nashville
Mexico_City Guadalajara Monterrey Bogota Lima Quito Santiago Buenos_Aires Montevideo
Sao_Paulo Rio_de_Janeiro Caracas Havana Kingston Panama_City San_Jose Reykjavik Edinburgh
Glasgow Manchester Liverpool London Bristol Leeds Cardiff Belfast Amsterdam Rotterdam
Brussels Antwerp Zurich Geneva Munich Hamburg Frankfurt Cologne Milan Naples Turin Florence
Venice Barcelona Valencia Seville Porto Marseille Lyon Nice Bordeaux Toulouse Copenhagen
Gothenburg Bergen Tallinn Riga Vilnius Kyiv Bucharest Sofia Belgrade Zagreb Ljubljana
Istanbul Ankara Tehran Baghdad Riyadh Doha Dubai Abu_Dhabi Muscat Amman Beirut Jerusalem
Tbilisi Yerevan Baku Almaty Tashkent Ulaanbaatar Anchorage Honolulu Fresno Omaha Tulsa
Boise Reno Spokane Tacoma Halifax Winnipeg Regina Quebec_City Marrakesh Fez Alexandria
Khartoum Mombasa Zanzibar Windhoek Gaborone Maputo Antananarivo Port_Louis Abuja Kano
Ibadan Enugu Kumasi Lome Cotonou Bamako Niamey Freetown Monrovia Banjul Conakry""".split()
CITIES = [c.replace("_", " ") for c in CITIES]

FIRST = """Anna Ben Carla David Elena Frank Grace Hugo Ines James Kofi Laura Mateo Nadia Omar
Priya Quinn Rosa Sam Tara Umar Vera Wes Xena Yusuf Zoe Aisha Bruno Chloe Diego Emma Femi
Gita Hana Ivan Jade Kenji Lena Marco Nia Oscar Paula Rahul Sofia Tom Uma Victor Wendy
Yara Zane Amara Bilal Cleo Dmitri Esther Farah Gabriel Helen Isaac Julia Kwame Leo Maya
Noah Olga Pedro Ravi Sara Theo Ursula Viktor Willa Ximena Yosef Zara Ada Boris Celia Dara
Eli Fatima Greta Hassan Ida Jonas Kira Liam Mira Nils Otto Pia Rene Selma Tariq Ulla
Vivian Walt Yuki Zeynep Adele Bashir Camila Dev Erin Felix Gloria Hiro Ingrid Joel Kemi
Lucia Malik Nora Orla Pablo Rania Simon Tess Uri Valeria Wanjiru Yasmin Zed Aaron Bea
Chidi Dana Emeka Fiona Goran Hilda Ike Jana Karim Lila Milo Ngozi Owen Petra Rico Sven
Tobi Ugo Vanessa Will Xavier Yolanda Zuri""".split()
LAST = """Smith Okafor Garcia Chen Kumar Novak Rossi Muller Silva Haddad Kim Nguyen Adeyemi
Johansson Costa Ivanova Tanaka Mensah Petrov Lopez Dubois Schmidt Moreau Khan Ali Patel
Wong Park Singh Cohen Jensen Larsen Brown Taylor Wilson Martin Clarke Walker Young Wright
Hill Green Baker Adams Nelson Carter Mitchell Perez Roberts Turner Phillips Campbell Parker
Evans Edwards Collins Stewart Morris Murphy Cook Rogers Morgan Cooper Peterson Reed Bailey
Bell Gomez Kelly Howard Ward Cox Diaz Richardson Wood Watson Brooks Bennett Gray James
Reyes Cruz Hughes Price Myers Long Foster Sanders Ross Morales Powell Sullivan Russell
Ortiz Jenkins Gutierrez Perry Butler Barnes Fisher Henderson Coleman Simmons Patterson
Jordan Reynolds Hamilton Graham Wallace Obi Eze Balogun Nwosu Abiodun""".split()

ROOMS = """kitchen bedroom living_room bathroom office hallway garage porch basement attic
dining_room nursery study guest_room patio garden laundry_room den playroom
master_bedroom""".split()
ROOMS = [r.replace("_", " ") for r in ROOMS]

ARTISTS = """Adele Beyonce Drake Rihanna Coldplay Radiohead Queen Abba Nirvana Metallica
Burna_Boy Wizkid Tems Davido Miles_Davis John_Coltrane Bach Mozart Beethoven Chopin
Taylor_Swift Ed_Sheeran Bob_Marley Fela_Kuti Daft_Punk Bjork Shakira Bad_Bunny Rosalia
Stromae Angelique_Kidjo Norah_Jones Billie_Eilish Kendrick_Lamar Frank_Ocean Sade
Fleetwood_Mac The_Beatles Pink_Floyd Led_Zeppelin Nina_Simone Aretha_Franklin
Stevie_Wonder Prince Madonna Dua_Lipa Lorde Sia Arcade_Fire Tame_Impala Khruangbin
Portishead Massive_Attack Erykah_Badu Outkast Lauryn_Hill Ali_Farka_Toure Youssou_Ndour
Cesaria_Evora Caetano_Veloso Jorge_Ben Astrud_Gilberto""".split()
ARTISTS = [a.replace("_", " ") for a in ARTISTS]
GENRES = """jazz rock pop classical lo-fi hip hop afrobeats reggae blues techno house
ambient country folk soul funk salsa bossa_nova k-pop metal punk disco gospel""".split()
GENRES = [g.replace("_", " ") for g in GENRES]

CURRENCIES = """USD EUR GBP JPY NGN KES ZAR INR CNY CAD AUD CHF SEK NOK DKK BRL MXN GHS
EGP MAD AED SAR TRY PLN CZK HUF KRW SGD THB IDR""".split()
UNITS = [("kilometers", "miles"), ("miles", "kilometers"), ("pounds", "kilograms"),
         ("kilograms", "pounds"), ("celsius", "fahrenheit"), ("fahrenheit", "celsius"),
         ("liters", "gallons"), ("gallons", "liters"), ("meters", "feet"), ("feet", "meters"),
         ("inches", "centimeters"), ("centimeters", "inches"), ("ounces", "grams"),
         ("grams", "ounces"), ("cups", "milliliters"), ("yards", "meters")]
LANGUAGES = """French Spanish German Italian Portuguese Japanese Korean Chinese Arabic Hindi
Swahili Yoruba Igbo Hausa Dutch Swedish Polish Turkish Greek Russian Zulu Amharic""".split()
STOCKS = """AAPL MSFT GOOG AMZN TSLA NVDA META NFLX INTC AMD IBM ORCL SAP ADBE CRM UBER
SHOP SPOT COIN PYPL DIS NKE KO PEP MCD SBUX BA GE F GM""".split()
SUBJECTS = ["the budget", "the trip", "the meeting notes", "the contract", "the party",
            "the invoice", "dinner plans", "the weekend", "the report", "the schedule",
            "the launch", "the interview", "the rent", "the lease", "the project update",
            "the offsite", "the flight", "the recipe", "the playlist", "the quarterly numbers",
            "the school run", "the dentist", "the wedding", "the birthday gift"]

MESSAGE_HEADS = ["I'm running late", "I'll be there in ten minutes", "call me back when you can",
                 "dinner is ready", "don't forget the tickets", "the meeting moved to noon",
                 "happy birthday", "thanks for the help", "can you pick up milk",
                 "see you at the station", "I left the keys under the mat",
                 "the package arrived", "let's meet at the cafe", "good luck today",
                 "I'm stuck in traffic", "the kids are asleep", "bring an umbrella",
                 "I found your wallet", "we won the match", "the car is fixed",
                 "the train is delayed", "save me a seat", "I'm at the front door",
                 "the doctor called", "lunch is on me", "flight landed safely",
                 "the heating is broken", "check your email", "I miss you",
                 "practice is cancelled", "the store closes at nine", "text me the address"]
NOTE_ITEMS = ["buy eggs", "buy bread", "get coffee beans", "call the plumber", "renew passport",
              "pay the water bill", "book flights", "pick up dry cleaning", "water the plants",
              "return library books", "fix the bike", "order printer ink", "email the landlord",
              "back up the laptop", "clean the fridge", "walk the dog", "gym at six",
              "send the slides", "ask about the refund", "charge the drone", "sort the photos",
              "plan the menu", "feed the cat", "take out the trash", "buy a birthday card",
              "submit the timesheet", "cancel the gym trial", "buy batteries",
              "schedule a haircut", "call grandma", "read chapter four", "stretch for ten minutes",
              "defrost the chicken", "pack the charger", "print the boarding pass",
              "update the resume", "change the bedsheets", "book a table for friday"]
EVENT_TITLES = ["team standup", "dentist appointment", "lunch with Sara", "yoga class",
                "project review", "parent teacher meeting", "flight to Accra", "book club",
                "quarterly planning", "piano lesson", "job interview", "car service",
                "coffee with Omar", "sprint demo", "family dinner", "football practice",
                "doctor visit", "movie night", "budget review", "design workshop",
                "haircut", "vet appointment", "board meeting", "study group", "date night",
                "client call", "hackathon kickoff", "wedding rehearsal", "garden club",
                "language exchange"]
SEARCHES = ["best pizza near me", "how tall is mount kenya", "cheap flights to Lisbon",
            "symptoms of the flu", "how to tie a tie", "news about the election",
            "recipes with lentils", "when is the next full moon", "train times to Leeds",
            "how to fix a leaky tap", "population of Brazil", "best running shoes",
            "opening hours of the museum", "jollof rice recipe", "learn python online",
            "weather radar", "football scores", "used cars for sale", "how to meditate",
            "history of the internet", "vegan lasagna", "hiking trails nearby",
            "how do vaccines work", "concerts this weekend", "solar panel prices"]
TRANSLATE_TEXTS = ["where is the train station", "thank you very much", "good morning",
                   "how much does this cost", "I would like a coffee", "see you tomorrow",
                   "the bill please", "nice to meet you", "I am lost", "happy new year",
                   "where is the bathroom", "one ticket please", "I love this city",
                   "can you help me", "what time is it", "the food was delicious",
                   "good night", "I don't understand", "how are you", "welcome home"]
VENDORS = ["Acme Supplies", "Bright Office", "Delta Logistics", "Green Leaf Catering",
           "Nova Print", "Blue River Plumbing", "Sunrise Bakery", "Metro Electric",
           "Atlas Hardware", "Pinnacle IT", "Harbor Freight Co", "Kano Textiles",
           "Orbit Cleaning", "Zenith Labs", "Lagoon Water", "Summit Legal",
           "Maple Consulting", "Cedar Furniture", "Falcon Couriers", "Crystal Glass"]
ROOM_TYPES = ["single", "double", "twin", "suite", "deluxe", "family"]
RIDE_TYPES = ["standard", "premium", "shared", "xl"]

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]


def stable(text):
    return zlib.crc32(str(text).encode("utf-8"))


def is_heldout(value):
    """Values (and templates) whose hash falls here belong to the test split only."""
    return stable(value) % 7 == 3


SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["sha", "tri", "kro", "lin",
                                                                   "mor", "ven", "ska", "dra"]
KEEP_WORDS = {"the", "a", "an", "to", "of", "in", "on", "at", "for", "me", "my", "I", "I'm",
              "is", "and", "with", "you", "your", "it", "be", "up"}


def pseudo_word(r, like):
    """A made-up word shaped like `like` (case, length class), or `like` itself when it
    is a function word: used to fill argument values with strings no model can guess."""
    if like in KEEP_WORDS or not like.isalpha():
        return like
    if like.isupper() and len(like) > 1:
        return "".join(r.choice("ABCDEFGHIJKLMNOPRSTUVWXYZ") for _ in like)
    w = "".join(r.choice(SYLLABLES) for _ in range(r.randint(1, 3)))
    return w.capitalize() if like[:1].isupper() else w


class Pools:
    """Draws values from the split's side of every pool.

    In the training split, half of the draws from a word pool are replaced by made-up
    words of the same shape (capitalised names, upper-case codes, lower-case phrases):
    a value that appears only in its query can only be produced by copying it, which is
    the skill the held-out split measures. Without them a small model learns the pools
    by heart instead (training loss falls while the held-out loss rises)."""

    SYNTHETIC = 0.7

    def __init__(self, split, rng):
        self.test = split == "test"
        self.r = rng

    def pick(self, pool):
        side = [v for v in pool if is_heldout(v) == self.test]
        return self.r.choice(side or pool)

    def value(self, pool):
        """An argument value from a free-text pool (see the class comment)."""
        v = self.pick(pool)
        if self.test or self.r.random() >= self.SYNTHETIC:
            return v
        return " ".join(pseudo_word(self.r, w) for w in v.split(" "))

    # Training prompts favour fewer declared tools: each tool schema costs ~55 tokens,
    # and compute, not data, limits a 2-core training run. The test split keeps the
    # uniform 1-5 (its draws, and so its examples, are unchanged).
    TRAIN_TOOL_WEIGHTS = [3.0, 3.0, 2.0, 1.2, 0.8]

    def tool_count(self, lo, hi):
        """How many tools an example declares, in [lo, hi]."""
        if self.test:
            return self.r.randint(lo, hi)
        return self.r.choices(range(lo, hi + 1), self.TRAIN_TOOL_WEIGHTS[lo - 1:hi])[0]

    def draw(self, make, tries=200):
        """A value from a generator function, on this split's side."""
        for _ in range(tries):
            v = make(self.r)
            if is_heldout(v) == self.test:
                return v
        return v

    # composite values
    def city(self):
        return self.value(CITIES)

    def person(self):
        if self.r.random() < 0.55:
            return self.value(FIRST)
        return self.value(FIRST) + " " + self.value(LAST)

    def int_in(self, lo, hi):
        return self.draw(lambda r: r.randint(lo, hi))

    def timer_minutes(self):
        return self.int_in(1, 180)

    def duration(self, m):
        """How a request says a duration (compose.Pools2 says it in more ways)."""
        return f"{m} minutes" if m != 1 else "1 minute"

    def clock(self):
        def make(r):
            h = r.randint(1, 12)
            m = r.choice([0, 0, 0, 15, 30, 45, 5, 10, 20, 25, 40, 50, 55])
            ampm = r.choice(["am", "pm"])
            return f"{h}:{m:02d} {ampm}" if m or r.random() < 0.4 else f"{h} {ampm}"
        return self.draw(make)

    def date(self):
        def make(r):
            k = r.random()
            if k < 0.25:
                return r.choice(["today", "tomorrow", "tonight", "this weekend"])
            if k < 0.5:
                return r.choice(["next ", ""]) + r.choice(WEEKDAYS)
            return f"{r.choice(MONTHS)} {r.randint(1, 28)}"
        return self.draw(make)

    def phone(self):
        return self.draw(lambda r: "+%d %d %03d %04d" % (r.choice([1, 44, 234, 254, 27, 91, 33]),
                                                        r.randint(20, 999), r.randint(0, 999),
                                                        r.randint(0, 9999)))

    def email(self, name):
        first = name.split()[0].lower()
        return self.draw(lambda r: first + r.choice([".", "_", ""]) +
                         r.choice([w.lower() for w in LAST]) + "@" +
                         r.choice(["gmail.com", "mail.com", "proton.me", "work.io", "acme.org"]))

    def amount(self):
        def make(r):
            if r.random() < 0.6:
                return r.choice([5, 10, 12, 15, 20, 25, 30, 40, 50, 60, 75, 80, 100, 120, 150,
                                 200, 250, 300, 400, 500, 750, 1000, 1200, 1500, 2000, 5000,
                                 r.randint(1, 999)])
            return round(r.randint(100, 99999) / 100, 2)
        return self.draw(make)


# --------------------------------------------------------------------------------------
# Tools: schema + phrasings. Each generator returns (query_fragment, call) with the
# fragment written lower-case-first so it can be joined into multi-call queries.
# --------------------------------------------------------------------------------------

def obj(props, required):
    return {"type": "object", "properties": props, "required": required}


def S(desc):
    return {"type": "string", "description": desc}


def I(desc, lo=None, hi=None):
    d = {"type": "integer", "description": desc}
    if lo is not None:
        d["minimum"] = lo
    if hi is not None:
        d["maximum"] = hi
    return d


def N(desc):
    return {"type": "number", "description": desc}


def B(desc):
    return {"type": "boolean", "description": desc}


def E(desc, values):
    return {"type": "string", "enum": values, "description": desc}


TOOLS = {}
PHRASES = {}


def tool(name, description, params, required):
    def register(gen):
        TOOLS[name] = {"name": name, "description": description,
                       "parameters": obj(params, required)}
        PHRASES[name] = gen
        return gen
    return register


def choose(p, templates):
    """A template on this split's side (templates are held out by hash like values)."""
    return p.pick(templates)


@tool("get_weather", "Get the current weather or forecast for a location.",
      {"location": S("City name"), "day": S("Day of the forecast, e.g. today or tomorrow")},
      ["location"])
def _weather(p):
    city = p.city()
    if p.r.random() < 0.35:
        day = p.pick(["today", "tomorrow", "this weekend", "tonight"] + WEEKDAYS)
        t = choose(p, ["what's the weather in {c} {d}", "will it rain in {c} {d}",
                       "weather forecast for {c} {d}", "how hot will it be in {c} {d}",
                       "is it going to be sunny in {c} {d}", "check the weather in {c} for {d}",
                       "do I need an umbrella in {c} {d}", "{d}'s weather in {c}",
                       "what will the weather be like in {c} {d}",
                       "give me the forecast for {c} {d}"])
        return t.format(c=city, d=day), {"location": city, "day": day}
    t = choose(p, ["what's the weather in {c}", "how's the weather in {c}",
                   "weather in {c}", "is it cold in {c} right now", "tell me the weather for {c}",
                   "what is the temperature in {c}", "check the weather in {c}",
                   "is it raining in {c}", "current conditions in {c}",
                   "how warm is it in {c}", "get me the weather for {c}"])
    return t.format(c=city), {"location": city}


def _minutes_phrase(p, m):
    return p.pick([f"{m} minutes", f"{m} minute", f"{m} min", f"{m} mins"]) if m != 1 else "1 minute"


@tool("set_timer", "Start a countdown timer.",
      {"minutes": I("Duration in minutes", 1, 1440), "label": S("Optional name for the timer")},
      ["minutes"])
def _timer(p):
    m = p.timer_minutes()
    dur = p.duration(m)
    if p.r.random() < 0.3:
        label = p.value(["pasta", "eggs", "laundry", "tea", "bread", "nap", "workout", "pizza",
                        "rice", "homework", "parking", "oven", "meditation", "cookies", "break"])
        t = choose(p, ["set a {d} timer for the {l}", "start a timer called {l} for {d}",
                       "timer for {d} named {l}", "set a timer for {d} for the {l}",
                       "remind me with a {l} timer in {d}", "put a {d} {l} timer on"])
        return t.format(d=dur, l=label), {"minutes": m, "label": label}
    t = choose(p, ["set a timer for {d}", "start a {d} timer", "timer {d}",
                   "count down {d}", "set a countdown for {d}", "give me a {d} timer",
                   "start a timer for {d} please", "can you time {d} for me",
                   "set timer to {d}", "begin a {d} countdown"])
    return t.format(d=dur), {"minutes": m}


@tool("set_alarm", "Set an alarm for a time of day.",
      {"time": S("Time, e.g. 7:30 am"), "label": S("Optional label")}, ["time"])
def _alarm(p):
    tm = p.clock()
    if p.r.random() < 0.3:
        label = p.value(["work", "gym", "school run", "medication", "flight", "meeting",
                        "wake up", "yoga", "pickup", "standup"])
        t = choose(p, ["set an alarm for {t} called {l}", "alarm at {t} for {l}",
                       "wake me at {t} for {l}", "set a {l} alarm at {t}",
                       "create an alarm labeled {l} at {t}"])
        return t.format(t=tm, l=label), {"time": tm, "label": label}
    t = choose(p, ["set an alarm for {t}", "wake me up at {t}", "alarm at {t}",
                   "set my alarm to {t}", "I need an alarm at {t}", "get me up at {t}",
                   "create an alarm for {t}", "please set an alarm at {t}",
                   "alarm for {t} tomorrow morning", "make an alarm for {t}"])
    return t.format(t=tm), {"time": tm}


@tool("set_lights", "Turn the lights in a room on or off, optionally setting brightness.",
      {"room": S("Room name"), "state": E("on or off", ["on", "off"]),
       "brightness": I("Brightness percent", 0, 100)}, ["room", "state"])
def _lights(p):
    room = p.value(ROOMS)
    state = p.r.choice(["on", "off"])
    if state == "on" and p.r.random() < 0.3:
        b = p.int_in(1, 100)
        t = choose(p, ["turn on the {r} lights at {b} percent", "set the {r} lights to {b}%",
                       "lights on in the {r} at {b} percent", "dim the {r} lights to {b}%",
                       "switch the {r} lights on to {b} percent brightness"])
        return t.format(r=room, b=b), {"room": room, "state": "on", "brightness": b}
    if state == "on":
        t = choose(p, ["turn on the {r} lights", "lights on in the {r}", "switch on the {r} light",
                       "turn the {r} lights on", "can you light up the {r}",
                       "put the lights on in the {r}", "{r} lights on please"])
    else:
        t = choose(p, ["turn off the {r} lights", "lights off in the {r}",
                       "switch off the {r} light", "turn the {r} lights off",
                       "kill the lights in the {r}", "shut off the {r} lights",
                       "{r} lights off please"])
    return t.format(r=room), {"room": room, "state": state}


@tool("set_thermostat", "Set the thermostat to a target temperature.",
      {"temperature": N("Target temperature"),
       "unit": E("Temperature unit", ["celsius", "fahrenheit"])}, ["temperature"])
def _thermo(p):
    def make(r):
        if r.random() < 0.7:
            return r.randint(15, 30) if r.random() < 0.6 else r.randint(60, 80)
        return r.randint(30, 59) / 2
    temp = p.draw(make)
    if p.r.random() < 0.5:
        unit = "fahrenheit" if (isinstance(temp, int) and temp >= 60) else "celsius"
        word = p.pick({"celsius": ["celsius", "degrees celsius", "C"],
                       "fahrenheit": ["fahrenheit", "degrees fahrenheit", "F"]}[unit])
        sep = "" if word in ("C", "F") else " "
        t = choose(p, ["set the thermostat to {v}{s}{u}", "make it {v}{s}{u} in here",
                       "heat the house to {v}{s}{u}", "change the temperature to {v}{s}{u}",
                       "thermostat {v}{s}{u}", "cool it down to {v}{s}{u}"])
        return t.format(v=temp, s=sep, u=word), {"temperature": temp, "unit": unit}
    t = choose(p, ["set the thermostat to {v}", "set the heat to {v} degrees",
                   "make it {v} degrees", "thermostat to {v}", "adjust the temperature to {v}",
                   "I want it at {v} degrees", "turn the heating to {v}"])
    return t.format(v=temp), {"temperature": temp}


@tool("send_message", "Send a text message to a contact.",
      {"recipient": S("Contact name"), "message": S("Message text")}, ["recipient", "message"])
def _message(p):
    who, msg = p.person(), p.value(MESSAGE_HEADS)
    t = choose(p, ["text {w} that {m}", "send a message to {w} saying {m}", "tell {w} {m}",
                   "message {w}: {m}", "send {w} a text: {m}", "let {w} know that {m}",
                   "shoot {w} a message saying {m}", "sms {w} {m}",
                   "write to {w} that {m}", "text {w} saying {m}"])
    return t.format(w=who, m=msg), {"recipient": who, "message": msg}


@tool("make_call", "Place a phone call to a contact.", {"contact": S("Who to call")}, ["contact"])
def _call(p):
    who = p.person()
    t = choose(p, ["call {w}", "phone {w}", "ring {w}", "give {w} a call", "dial {w}",
                   "start a call with {w}", "can you call {w} for me", "I want to call {w}",
                   "get {w} on the phone", "make a call to {w}"])
    return t.format(w=who), {"contact": who}


@tool("create_event", "Add an event to the calendar.",
      {"title": S("Event title"), "date": S("Date"), "time": S("Start time")},
      ["title", "date"])
def _event(p):
    title, date = p.value(EVENT_TITLES), p.date()
    if p.r.random() < 0.6:
        tm = p.clock()
        t = choose(p, ["schedule {e} on {d} at {t}", "add {e} to my calendar for {d} at {t}",
                       "put {e} in the calendar {d} at {t}", "book {e} for {d} at {t}",
                       "create an event {e} on {d} at {t}", "calendar: {e}, {d}, {t}",
                       "I have {e} {d} at {t}, add it"])
        return t.format(e=title, d=date, t=tm), {"title": title, "date": date, "time": tm}
    t = choose(p, ["schedule {e} on {d}", "add {e} to my calendar for {d}",
                   "put {e} in the calendar for {d}", "create an event called {e} on {d}",
                   "block {d} for {e}", "new calendar event {e} {d}"])
    return t.format(e=title, d=date), {"title": title, "date": date}


@tool("create_reminder", "Create a reminder.",
      {"text": S("What to be reminded of"), "time": S("When")}, ["text", "time"])
def _reminder(p):
    item = p.value(NOTE_ITEMS)
    when = p.clock() if p.r.random() < 0.5 else p.date()
    t = choose(p, ["remind me to {x} at {w}", "remind me {w} to {x}",
                   "set a reminder to {x} {w}", "don't let me forget to {x} {w}",
                   "reminder: {x} at {w}", "create a reminder for {w} to {x}",
                   "ping me {w} to {x}", "I need a reminder to {x} {w}"])
    return t.format(x=item, w=when), {"text": item, "time": when}


@tool("play_music", "Play music by artist, song, playlist or genre.",
      {"query": S("What to play"), "shuffle": B("Shuffle playback")}, ["query"])
def _music(p):
    q = p.value(ARTISTS) if p.r.random() < 0.6 else p.value(GENRES)
    if p.r.random() < 0.25:
        t = choose(p, ["shuffle {q}", "play {q} on shuffle", "shuffle some {q}",
                       "put {q} on shuffle", "play {q} shuffled"])
        return t.format(q=q), {"query": q, "shuffle": True}
    t = choose(p, ["play {q}", "put on some {q}", "I want to listen to {q}", "play some {q}",
                   "start playing {q}", "can you play {q}", "queue up {q}",
                   "music: {q}", "let's hear some {q}", "throw on {q}"])
    return t.format(q=q), {"query": q}


@tool("get_directions", "Get directions to a destination.",
      {"destination": S("Where to go"),
       "mode": E("Travel mode", ["driving", "walking", "transit", "cycling"])},
      ["destination"])
def _directions(p):
    dest = p.city() if p.r.random() < 0.5 else p.value(
        ["the airport", "the nearest pharmacy", "the train station", "the office",
         "the stadium", "the beach", "the city center", "the hospital", "the zoo",
         "the museum", "the mall", "the harbor", "the university", "the market"])
    if p.r.random() < 0.5:
        mode, words = p.r.choice([("driving", ["drive", "driving", "by car"]),
                                  ("walking", ["walk", "walking", "on foot"]),
                                  ("transit", ["by bus", "by train", "on public transport"]),
                                  ("cycling", ["bike", "cycling", "by bike"])])
        w = p.pick(words)
        t = choose(p, ["directions to {x} {w}", "how do I get to {x} {w}",
                       "navigate to {x} {w}", "route to {x} {w}",
                       "show me the way to {x} {w}", "take me to {x} {w}"])
        if w in ("drive", "walk", "bike"):
            t = choose(p, ["I want to {w} to {x}", "how long to {w} to {x}",
                           "let's {w} to {x}", "best way to {w} to {x}"])
        return t.format(x=dest, w=w), {"destination": dest, "mode": mode}
    t = choose(p, ["directions to {x}", "how do I get to {x}", "navigate to {x}",
                   "take me to {x}", "route to {x}", "find the way to {x}",
                   "show me how to get to {x}", "get me to {x}"])
    return t.format(x=dest), {"destination": dest}


@tool("create_note", "Save a note.", {"content": S("Note text")}, ["content"])
def _note(p):
    x = p.value(NOTE_ITEMS)
    t = choose(p, ["make a note to {x}", "note: {x}", "write down {x}", "save a note saying {x}",
                   "jot down {x}", "add a note {x}", "take a note: {x}", "remember this: {x}"])
    return t.format(x=x), {"content": x}


@tool("find_contact", "Look up a contact's details.", {"name": S("Contact name")}, ["name"])
def _contact(p):
    who = p.person()
    t = choose(p, ["what's {w}'s number", "find {w} in my contacts", "look up {w}",
                   "show me {w}'s contact", "get the contact details for {w}",
                   "search contacts for {w}", "do I have {w}'s email", "pull up {w}'s info"])
    return t.format(w=who), {"name": who}


@tool("convert_currency", "Convert an amount between currencies.",
      {"amount": N("Amount"), "from_currency": S("ISO code to convert from"),
       "to_currency": S("ISO code to convert to")}, ["amount", "from_currency", "to_currency"])
def _currency(p):
    amt = p.amount()
    a = p.value(CURRENCIES)
    b = p.value([c for c in CURRENCIES if c != a])
    t = choose(p, ["convert {v} {a} to {b}", "how much is {v} {a} in {b}",
                   "{v} {a} to {b}", "what's {v} {a} in {b}", "exchange {v} {a} into {b}",
                   "change {v} {a} to {b}", "how many {b} is {v} {a}",
                   "convert {v} from {a} to {b}"])
    return t.format(v=amt, a=a, b=b), {"amount": amt, "from_currency": a, "to_currency": b}


@tool("convert_units", "Convert a value between units of measure.",
      {"value": N("Value"), "from_unit": S("Unit to convert from"), "to_unit": S("Unit to convert to")},
      ["value", "from_unit", "to_unit"])
def _units(p):
    v = p.amount()
    a, b = p.r.choice(UNITS)
    t = choose(p, ["convert {v} {a} to {b}", "how many {b} is {v} {a}", "{v} {a} in {b}",
                   "what is {v} {a} in {b}", "change {v} {a} into {b}",
                   "{v} {a} to {b} please"])
    return t.format(v=v, a=a, b=b), {"value": v, "from_unit": a, "to_unit": b}


@tool("set_volume", "Set the speaker volume.", {"level": I("Volume percent", 0, 100)}, ["level"])
def _volume(p):
    v = p.int_in(0, 100)
    t = choose(p, ["set the volume to {v}", "volume {v}", "turn the volume to {v} percent",
                   "change volume to {v}%", "make the volume {v}", "adjust volume to {v}",
                   "put the sound at {v}"])
    return t.format(v=v), {"level": v}


@tool("set_wifi", "Turn Wi-Fi on or off.", {"enabled": B("true to turn on")}, ["enabled"])
def _wifi(p):
    on = p.r.random() < 0.5
    t = choose(p, ["turn {o} wifi", "switch {o} the wifi", "wifi {o}", "turn the wi-fi {o}",
                   "can you turn {o} wifi", "put wifi {o}"])
    return t.format(o="on" if on else "off"), {"enabled": on}


@tool("set_do_not_disturb", "Enable or disable do not disturb.",
      {"enabled": B("true to enable")}, ["enabled"])
def _dnd(p):
    on = p.r.random() < 0.5
    if on:
        t = choose(p, ["turn on do not disturb", "enable do not disturb", "silence my phone",
                       "do not disturb on", "I don't want to be disturbed", "mute notifications"])
    else:
        t = choose(p, ["turn off do not disturb", "disable do not disturb",
                       "do not disturb off", "unmute notifications", "end do not disturb"])
    return t, {"enabled": on}


@tool("send_email", "Send an email.",
      {"to": S("Recipient"), "subject": S("Subject line"), "body": S("Body text")},
      ["to", "subject"])
def _email(p):
    who, subj = p.person(), p.value(SUBJECTS)
    if p.r.random() < 0.4:
        body = p.value(MESSAGE_HEADS)
        t = choose(p, ["email {w} about {s} saying {b}", "send {w} an email about {s}: {b}",
                       "write an email to {w} with subject {s} and say {b}",
                       "mail {w} re {s}: {b}"])
        return t.format(w=who, s=subj, b=body), {"to": who, "subject": subj, "body": body}
    t = choose(p, ["email {w} about {s}", "send an email to {w} about {s}",
                   "write {w} an email regarding {s}", "email {w} with the subject {s}",
                   "drop {w} an email about {s}", "send {w} a mail about {s}"])
    return t.format(w=who, s=subj), {"to": who, "subject": subj}


@tool("search_web", "Search the web.", {"query": S("Search terms")}, ["query"])
def _search(p):
    q = p.value(SEARCHES)
    t = choose(p, ["search for {q}", "google {q}", "look up {q} online", "search the web for {q}",
                   "find {q} on the internet", "web search: {q}", "can you search {q}"])
    return t.format(q=q), {"query": q}


@tool("get_stock_price", "Get the latest stock price for a ticker.",
      {"symbol": S("Ticker symbol")}, ["symbol"])
def _stock(p):
    s = p.value(STOCKS)
    t = choose(p, ["what's {s} trading at", "stock price of {s}", "how is {s} doing today",
                   "quote for {s}", "check the {s} share price", "get me {s} stock",
                   "price of {s} shares"])
    return t.format(s=s), {"symbol": s}


@tool("book_ride", "Book a ride to a destination.",
      {"destination": S("Drop-off place"), "ride_type": E("Ride class", RIDE_TYPES)},
      ["destination"])
def _ride(p):
    dest = p.value(["the airport", "the train station", "the office", "downtown", "the hotel",
                   "the stadium", "the conference center", "the hospital", "home",
                   "the mall", "the museum", "the harbor"]) if p.r.random() < 0.6 else p.city()
    if p.r.random() < 0.35:
        rt = p.r.choice(RIDE_TYPES)
        t = choose(p, ["book a {k} ride to {x}", "get me a {k} car to {x}",
                       "order a {k} taxi to {x}", "I need a {k} ride to {x}"])
        return t.format(k=rt, x=dest), {"destination": dest, "ride_type": rt}
    t = choose(p, ["book a ride to {x}", "get me a taxi to {x}", "call a cab to {x}",
                   "I need a ride to {x}", "order a car to {x}", "find me a ride to {x}"])
    return t.format(x=dest), {"destination": dest}


@tool("translate_text", "Translate text into another language.",
      {"text": S("Text to translate"), "target_language": S("Language to translate into")},
      ["text", "target_language"])
def _translate(p):
    x, lang = p.value(TRANSLATE_TEXTS), p.value(LANGUAGES)
    t = choose(p, ["translate {x} into {l}", "how do you say {x} in {l}",
                   "what is {x} in {l}", "say {x} in {l}", "{l} for {x}",
                   "translate to {l}: {x}"])
    return t.format(x=x, l=lang), {"text": x, "target_language": lang}


@tool("set_brightness", "Set the screen brightness.", {"level": I("Brightness percent", 0, 100)},
      ["level"])
def _brightness(p):
    v = p.int_in(0, 100)
    t = choose(p, ["set screen brightness to {v}", "brightness {v} percent",
                   "make the screen {v}% bright", "change display brightness to {v}",
                   "screen brightness to {v}"])
    return t.format(v=v), {"level": v}


# Extraction records: the query is a passage, the call extracts its fields.

@tool("save_contact", "Save a contact card extracted from text.",
      {"name": S("Full name"), "phone": S("Phone number"), "email": S("Email address")},
      ["name", "phone"])
def _card(p):
    name = p.value(FIRST) + " " + p.value(LAST)
    phone = p.phone()
    if p.r.random() < 0.6:
        mail = p.email(name)
        t = choose(p, ["save this contact: {n}, {p}, {e}",
                       "met {n} today, number {p}, email {e}, add them",
                       "new contact {n} phone {p} email {e}",
                       "{n} can be reached at {p} or {e}, save that",
                       "add {n} to contacts with phone {p} and email {e}"])
        return t.format(n=name, p=phone, e=mail), {"name": name, "phone": phone, "email": mail}
    t = choose(p, ["save {n}'s number {p}", "add contact {n} {p}",
                   "new contact: {n}, {p}", "store {n} with the number {p}",
                   "{n}'s phone is {p}, save it"])
    return t.format(n=name, p=phone), {"name": name, "phone": phone}


@tool("record_booking", "Record a hotel booking from text.",
      {"guest": S("Guest name"), "check_in": S("Check-in date"),
       "nights": I("Number of nights", 1, 60), "room_type": E("Room type", ROOM_TYPES)},
      ["guest", "check_in", "nights", "room_type"])
def _booking(p):
    name = p.value(FIRST) + " " + p.value(LAST)
    date = p.date()
    nights = p.int_in(1, 14)
    room = p.r.choice(ROOM_TYPES)
    nn = f"{nights} nights" if nights != 1 else "1 night"
    t = choose(p, ["booking for {g}: {n} from {d}, {r} room",
                   "{g} checks in {d} for {n} in a {r} room, record it",
                   "record a {r} room for {g}, {n}, arriving {d}",
                   "reservation: {g}, {r}, {n}, check-in {d}",
                   "please log {g}'s stay, {n} in a {r} room starting {d}"])
    return t.format(g=name, n=nn, d=date, r=room), {"guest": name, "check_in": date,
                                                    "nights": nights, "room_type": room}


@tool("record_invoice", "Record an invoice from text.",
      {"vendor": S("Who issued it"), "amount": N("Total amount"), "due": S("Due date")},
      ["vendor", "amount", "due"])
def _invoice(p):
    vendor, amt, due = p.value(VENDORS), p.amount(), p.date()
    t = choose(p, ["invoice from {v} for {a} due {d}", "{v} billed us {a}, payment due {d}",
                   "record the {v} invoice: {a}, due {d}",
                   "we owe {v} {a} by {d}, log the invoice",
                   "new invoice {v}, total {a}, due {d}"])
    return t.format(v=vendor, a=amt, d=due), {"vendor": vendor, "amount": amt, "due": due}


# --------------------------------------------------------------------------------------
# Off-topic queries (answer [])
# --------------------------------------------------------------------------------------

COUNTRIES = ["France", "Kenya", "Japan", "Brazil", "Canada", "Egypt", "India", "Peru",
             "Norway", "Ghana", "Chile", "Spain", "Vietnam", "Morocco", "Ireland", "Nepal"]
ANIMALS = ["cats", "penguins", "dogs", "owls", "sharks", "elephants", "frogs", "bees"]
FOODS = ["rice", "pasta", "pancakes", "soup", "curry", "bread", "jollof", "risotto"]


OFF_TOPIC = ["what's the capital of {c}", "tell me a joke about {a}",
             "how do I cook {f}", "who are you", "what is the meaning of life",
             "write a poem about {a}", "why is the sky blue", "how old is the universe",
             "what does {a} eat", "recommend a book about {c}", "hello there",
             "thanks, that's all", "what's your favorite color", "explain gravity",
             "how many people live in {c}", "is {f} healthy",
             "what language do they speak in {c}", "tell me something interesting",
             "how are you today", "good morning", "can {a} swim", "what is {x} plus {y}",
             "who invented the telephone", "summarize the history of {c}",
             "I'm bored", "what's a good name for a cat", "do you like {f}",
             "how do airplanes fly", "what is love", "define photosynthesis"]


def off_topic(p):
    t = choose(p, OFF_TOPIC)
    return t.format(c=p.pick(COUNTRIES), a=p.pick(ANIMALS), f=p.pick(FOODS),
                    x=p.r.randint(2, 99), y=p.r.randint(2, 99))


# Training-only variety for the off-topic class. The thirty templates above are split by
# hash like every other list, which leaves the model two dozen off-topic sentences to learn
# "answer []" from, and it learns those sentences rather than the class: held-out refusal
# accuracy was 3%. These are composed from parts (several thousand distinct sentences);
# any that matches a held-out template above is dropped (`_leaks_heldout`), so the test
# split's off-topic phrasings stay unseen.
CHAT_TOPICS = ["volcanoes", "the moon", "black holes", "the Roman empire", "dinosaurs",
               "chess", "football", "the ocean", "rainbows", "electricity", "coffee",
               "the pyramids", "bitcoin", "tea", "jazz history", "the internet", "vaccines",
               "earthquakes", "the olympics", "honey", "glaciers", "robots", "democracy",
               "the stock market", "sleep", "yoga", "origami", "tides", "the Renaissance",
               "quantum physics", "climate change", "mushrooms", "the Silk Road", "tigers",
               "whales", "lightning", "magnets", "cheese", "chocolate", "the brain",
               "samurai", "vikings", "the printing press", "bridges", "deserts", "comets",
               "photosynthesis in algae", "the human heart", "poetry", "opera", "knitting",
               "marathons", "the Nile", "Mount Everest", "the Amazon rainforest", "gardening"]
CHAT_ASK = ["tell me about {t}", "what do you know about {t}", "explain {t} to me",
            "give me three facts about {t}", "why are people interested in {t}",
            "how does {t} work", "what is the history of {t}", "teach me something about {t}",
            "is {t} interesting", "what's so special about {t}", "describe {t}",
            "I want to learn about {t}", "any fun facts about {t}?", "what should I know about {t}",
            "can you explain {t} simply", "write a short story about {t}",
            "write a haiku about {t}", "make up a riddle about {t}", "what do you think of {t}",
            "I love {t}", "do you know anything about {t}?", "compare {t} and {u}",
            "which is older, {t} or {u}?", "what's the link between {t} and {u}"]
CHAT_PLAIN = ["hi", "hey", "good evening", "good night", "how's it going", "what's up",
              "thank you", "thanks a lot", "you're awesome", "never mind", "ok cool",
              "that's funny", "I'm tired", "I'm hungry", "I feel sad today", "I'm happy",
              "what can you do", "are you a robot", "what's your name", "do you dream",
              "sing me a song", "tell me a story", "flip a coin", "pick a number",
              "what day is it today", "is it a good day", "I need advice", "cheer me up",
              "what should I eat tonight", "what should I watch", "guess my age",
              "let's play a game", "say something nice", "do you have feelings",
              "what's the best movie ever", "how do I become rich", "what is happiness",
              "should I learn to code", "how do I stay motivated", "what is art",
              "who won the last world cup", "what time zone is it in space",
              "how far away is the sun", "how many legs does a spider have",
              "how hot is the sun", "what is the tallest mountain", "why do cats purr",
              "what is the speed of light", "how do bees make honey", "what is DNA"]
CHAT_MATH = ["what is {x} times {y}", "what's {x} minus {y}", "how much is {x} divided by {y}",
             "add {x} and {y}", "is {x} a prime number", "what is the square of {x}",
             "{x} plus {y} equals what", "what is {x} percent of {y}"]
CHAT_ASK_PLACE = ["what is {c} famous for", "what food is popular in {c}",
                  "what's the weather usually like in {c} in {m}",
                  "is {c} a good place to live", "what sports do people play in {c}",
                  "tell me about the culture of {c}", "what currency does {c} use",
                  "when was {c} founded", "which river runs through {c}",
                  "what is the oldest building in {c}", "what's the national dish of {c}"]
UNAVAILABLE = ["order a pizza", "buy new running shoes", "vacuum the floor",
               "start the dishwasher", "lock the front door", "feed the fish",
               "open the garage door", "print this page", "take a photo",
               "record a voice memo", "scan this document", "order more coffee pods",
               "pay my electricity bill", "water the garden", "start the car",
               "book a table for two", "check my bank balance", "delete my last photo",
               "turn on the coffee machine", "charge my phone", "renew my library books",
               "tweet that I'm on holiday", "post a photo to instagram", "rate this song five stars",
               "subscribe to the newsletter", "cancel my gym membership", "order groceries",
               "track my package", "update my apps", "clear the browser history"]


def _template_regex(t):
    return re.compile("^" + re.sub(r"\\\{[a-z]\\\}", ".+", re.escape(t)) + "$", re.I)


HELDOUT_OFF_TOPIC = [_template_regex(t) for t in OFF_TOPIC if is_heldout(t)]


def _leaks_heldout(q):
    return any(rx.match(q) for rx in HELDOUT_OFF_TOPIC)


def chatter(p):
    """A training-only off-topic query composed from parts (see CHAT_TOPICS)."""
    while True:
        k = p.r.random()
        if k < 0.35:
            t, u = p.r.sample(CHAT_TOPICS, 2)
            q = p.r.choice(CHAT_ASK).format(t=t, u=u)
        elif k < 0.6:
            q = p.r.choice(CHAT_PLAIN)
        elif k < 0.72:
            q = p.r.choice(CHAT_MATH).format(x=p.r.randint(2, 999), y=p.r.randint(2, 999))
        elif k < 0.87:
            place = p.city() if p.r.random() < 0.5 else p.pick(COUNTRIES)
            q = p.r.choice(CHAT_ASK_PLACE).format(c=place, m=p.r.choice(MONTHS))
        else:
            q = p.r.choice(UNAVAILABLE)
        if not _leaks_heldout(q):
            return q


LEAD_INS = ["hey, ", "please ", "could you ", "ok ", "quick one: "]
CONNECTORS = [" and ", ", then ", " and also ", ". Also ", ", and ", " then "]


def cap(s):
    return s[:1].upper() + s[1:]


def finish(p, q):
    q = cap(q) if p.r.random() < 0.6 else q
    r = p.r.random()
    if r < 0.25:
        q += "."
    elif r < 0.35 and not q.endswith("?"):
        q += " please"
    elif r < 0.45:
        q = p.pick(LEAD_INS) + q[:1].lower() + q[1:]
    return q


def example(p, names):
    """One example. `names` is the tool catalogue."""
    # Cumulative shares: composed chatter, off-topic template, request for an undeclared
    # tool, two calls (the rest is one call). Training sees more refusals than the test
    # split's 16%, half of its off-topic queries composed (`chatter`), so the class is
    # learned rather than its two dozen sentences. The test split's shares, draws and
    # so examples are unchanged.
    chat, off, undeclared, two = (0.0, 0.10, 0.16, 0.36) if p.test else (0.08, 0.16, 0.26, 0.46)
    r = p.r.random()
    if r < chat:
        declared = p.r.sample(names, p.tool_count(1, 5))
        return finish(p, chatter(p)), declared, []
    if r < off:                     # off-topic, any tools declared
        declared = p.r.sample(names, p.tool_count(1, 5))
        return finish(p, off_topic(p)), declared, []
    if r < undeclared:              # a request for a tool that is not declared
        want = p.r.choice(names)
        frag, _ = PHRASES[want](p)
        others = [n for n in names if n != want and not _similar(n, want)]
        declared = p.r.sample(others, p.tool_count(1, 4))
        return finish(p, frag), declared, []
    ncalls = 2 if r < two else 1
    called = p.r.sample(names, ncalls)
    frags, calls = [], []
    for n in called:
        frag, args = PHRASES[n](p)
        frags.append(frag)
        calls.append({"name": n, "arguments": args})
    q = frags[0]
    for f in frags[1:]:
        q += p.pick(CONNECTORS) + f
    extra = [n for n in names if n not in called]
    declared = called + p.r.sample(extra, p.tool_count(ncalls, 5) - ncalls)
    p.r.shuffle(declared)
    return finish(p, q), declared, calls


# Tools whose requests another tool could plausibly serve: never used as the stand-in
# "other tools" of a refusal example for each other.
SIMILAR = [{"set_lights", "set_brightness"}, {"make_call", "find_contact"},
           {"send_message", "send_email"}, {"convert_currency", "convert_units"},
           {"create_reminder", "create_note", "create_event", "set_alarm", "set_timer"},
           {"get_directions", "book_ride"}, {"search_web", "get_stock_price", "get_weather"},
           {"save_contact", "find_contact"}]


def _similar(a, b):
    return any(a in s and b in s for s in SIMILAR)


def make_split(split, n, seed):
    rng = random.Random(seed)
    p = Pools(split, rng)
    names = sorted(TOOLS)
    seen, out = set(), []
    while len(out) < n:
        query, declared, calls = example(p, names)
        key = query + "|" + ",".join(declared)
        if key in seen:
            continue
        seen.add(key)
        out.append({"query": query, "tools": [TOOLS[d] for d in declared], "answers": calls})
    return out


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "data"))
    ap.add_argument("--train", type=int, default=60000)
    ap.add_argument("--test", type=int, default=600)
    ap.add_argument("--test2", type=int, default=600)
    ap.add_argument("--unseen", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--gen1", action="store_true",
                    help="the first generation's training split (the shipped model's stage 2)")
    ap.add_argument("--unseen-train", type=int, default=0, metavar="N",
                    help="write only unseen_train.jsonl: N training examples for the six "
                    "unseen tools (compose.make_unseen_train), none of unseen.jsonl's queries")
    ap.add_argument("--unseen-refusals", type=float, default=0.12, metavar="F",
                    help="with --unseen-train: the share of refusals (default 0.12, as "
                    "unseen.jsonl; the demo's own mix has ~0.24, test2 ~0.33)")
    ap.add_argument("--unseen-near-miss", type=float, default=0.0, metavar="F",
                    help="with --unseen-train: of the refusals, the share that declare "
                    "other new tools as distractors (default 0)")
    ap.add_argument("--unseen-chatter", type=float, default=0.0, metavar="F",
                    help="with --unseen-train: of the refusals, the share that are "
                    "off-topic chatter with new tools declared (default 0)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    import compose as C
    if a.unseen_train:
        held = os.path.join(os.path.dirname(__file__), "data", "unseen.jsonl")
        with open(held, encoding="utf-8") as f:
            queries = [json.loads(line)["query"] for line in f if line.strip()]
        rows = C.make_unseen_train(a.unseen_train, a.seed + 4000, queries, a.unseen_refusals,
                                   a.unseen_near_miss, a.unseen_chatter)
        write_jsonl(os.path.join(a.out, "unseen_train.jsonl"), rows)
        print(f"wrote {len(rows)} unseen-tool training examples to {a.out}")
        return
    if a.gen1:
        train = make_split("train", a.train, a.seed)
    else:
        train = C.make_split2("train", a.train, a.seed)
    test = make_split("test", a.test, a.seed + 1000)
    test2 = C.make_split2("test2", a.test2, a.seed + 2000)
    unseen = C.make_split2("unseen", a.unseen, a.seed + 3000, make=C.example_unseen)
    write_jsonl(os.path.join(a.out, "train.jsonl"), train)
    write_jsonl(os.path.join(a.out, "test.jsonl"), test)
    write_jsonl(os.path.join(a.out, "test2.jsonl"), test2)
    write_jsonl(os.path.join(a.out, "unseen.jsonl"), unseen)
    with open(os.path.join(a.out, "tools.json"), "w") as f:
        json.dump([TOOLS[n] for n in sorted(TOOLS)], f, indent=1)
    print(f"{len(TOOLS)} tools; wrote {len(train)} train, {len(test)} test, {len(test2)} "
          f"test2 and {len(unseen)} unseen-tool examples to {a.out}")


if __name__ == "__main__":
    main()
